"""What a run learns (the `task` group), in one place: the task table (`spec.SPECS`), one
`TaskSpec` per task: its loss, its metrics under stable Keras names, the size of the model's
head, its main metric, and the check that the dataset's targets fit it (before any training).

| task           | head                | loss                                  | metrics                               |
|----------------|---------------------|---------------------------------------|---------------------------------------|
| classification | num_classes logits  | sparse categorical cross-entropy      | accuracy (+ top_K_accuracy)           |
| binary         | 1 logit             | binary cross-entropy                  | accuracy, auc, precision, recall      |
| multilabel     | N logits            | sigmoid (binary) cross-entropy        | binary_accuracy, auc, f1_micro/macro  |
| regression     | N linear outputs    | mse, mae or huber                     | mae, rmse, r2                         |

Options: `task.loss` / `task.metrics` by `_target_`; `task.class_weight` (per-example weights
the input pipeline adds, averaged alike by every loop) and `task.standardize_targets`, both
fitted on the training split (`fitted`); each task's default monitor and the names a sweep may
optimize.

spec.py (the table, the names, no TensorFlow) · outputs.py (what the outputs mean: the
signature's names, `predict`'s decoding) · config.py (the task config it reads) ·
keras_objects.py (the Keras losses and metrics) · checks.py (targets against a task) ·
fitted.py (class weights, target standardization) · positive.py (`task.positive_class`: which
class is 1).
Imports no TensorFlow at module level: the config check (`tfrecipe validate`) uses the names.
"""

from tfrecipe.tasks.config import TaskConfig as TaskConfig
from tfrecipe.tasks.fitted import class_weights as class_weights
from tfrecipe.tasks.fitted import target_scaling as target_scaling
from tfrecipe.tasks.fitted import training_targets as training_targets
from tfrecipe.tasks.fitted import weigh_examples as weigh_examples
from tfrecipe.tasks.keras_objects import extra_metric_name as extra_metric_name
from tfrecipe.tasks.keras_objects import register_custom_objects as register_custom_objects
from tfrecipe.tasks.outputs import Outputs as Outputs
from tfrecipe.tasks.positive import orient as orient
from tfrecipe.tasks.positive import positive_class as positive_class
from tfrecipe.tasks.spec import DEFAULT_TASK as DEFAULT_TASK
from tfrecipe.tasks.spec import MODEL_ARGUMENTS as MODEL_ARGUMENTS
from tfrecipe.tasks.spec import OLD_SIGNATURE_HINT as OLD_SIGNATURE_HINT
from tfrecipe.tasks.spec import SPECS as SPECS
from tfrecipe.tasks.spec import TaskSpec as TaskSpec
from tfrecipe.tasks.spec import best_row as best_row
from tfrecipe.tasks.spec import check_targets as check_targets
from tfrecipe.tasks.spec import default_monitor as default_monitor
from tfrecipe.tasks.spec import has_positive_class as has_positive_class
from tfrecipe.tasks.spec import loss as loss
from tfrecipe.tasks.spec import main_metric as main_metric
from tfrecipe.tasks.spec import main_metric_named as main_metric_named
from tfrecipe.tasks.spec import metric_names as metric_names
from tfrecipe.tasks.spec import metrics as metrics
from tfrecipe.tasks.spec import monitor_mode as monitor_mode
from tfrecipe.tasks.spec import monitors as monitors
from tfrecipe.tasks.spec import num_outputs as num_outputs
from tfrecipe.tasks.spec import outputs_of as outputs_of
from tfrecipe.tasks.spec import spec_of as spec_of
from tfrecipe.tasks.spec import summary_names as summary_names
