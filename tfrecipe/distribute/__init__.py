"""Distribution: the tf.distribute strategy, who this process is in a cluster, the local launcher,
and the sidecar evaluator."""
