"""`tfrecipe k8s [--name N] [--image I] [--workers N] [--ps N] [...] [key=value ...]`: the
Kubernetes objects that run these overrides on a cluster of that shape, as YAML on stdout
(`tfrecipe k8s strategy=multi_worker_mirrored --image REGISTRY/tfrecipe | kubectl apply -f -`):
the ReadWriteMany volume claim `tfrecipe-runs`, the headless Service and the indexed Job
(tfrecipe/distribute/k8s_manifests.py). The config is validated first, as the pods will run it
(`cluster=k8s`); no TensorFlow.
"""

from __future__ import annotations

import argparse
import dataclasses

from tfrecipe.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit code 2, as every usage mistake
        raise ConfigError(f"k8s: {message} (tfrecipe k8s --help)")


def _parse(args: list[str]) -> argparse.Namespace:
    from tfrecipe.distribute.k8s_manifests import Shape

    default = Shape()
    parser = _Parser(prog="tfrecipe k8s", description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default=default.name, help="the Job's, Service's, run dir's")
    parser.add_argument("--image", default=default.image, help="built from the Dockerfile")
    parser.add_argument("--workers", type=int, default=default.workers)
    parser.add_argument("--ps", type=int, default=default.ps, help="parameter servers")
    parser.add_argument("--port", type=int, default=default.port)
    parser.add_argument("--cpu", default=default.cpu, help="each pod's CPU limit")
    parser.add_argument("--memory", default=default.memory, help="each pod's memory limit")
    parser.add_argument("--volume-size", default=default.volume_size)
    parser.add_argument("--storage-class", default=None, help="a ReadWriteMany class")
    parser.add_argument("overrides", nargs="*", help="key=value, as for python -m tfrecipe")
    return parser.parse_args(args)


def _secret_problems(overrides: list[str]) -> list[str]:
    """A secret typed among `overrides` would be written into the pods' args, which whoever may
    read the Job or its pods sees (a run's own command line moves one into the environment,
    secrets.typed_by_reference, where no pod of the Job has it)."""
    from tfrecipe.config.secrets import holds_secret, typed_by_reference
    from tfrecipe.printed import redact_word

    moved = typed_by_reference(list(overrides), {})  # changes exactly the overrides holding one
    return [
        f"k8s: {redact_word(typed)}: a secret would be written into the Job's pod args; give the "
        "pods its value from a Kubernetes Secret in their environment instead (e.g. "
        "MLFLOW_TRACKING_URI, WANDB_API_KEY)"
        for typed, kept in zip(overrides, moved, strict=True)
        if typed != kept or holds_secret(typed)
    ]


def main(args: list[str]) -> None:
    import yaml

    from tfrecipe.config.compose import compose
    from tfrecipe.config.schema import validate
    from tfrecipe.config.trust import Trust
    from tfrecipe.distribute.k8s_manifests import Shape, manifests
    from tfrecipe.printed import command_line

    options = _parse(args)
    bad = [o for o in options.overrides if "=" not in o]
    if bad:
        raise ConfigError(f"k8s: expected key=value overrides, received {' '.join(bad)}")
    secret = _secret_problems(options.overrides)
    if secret:
        raise ConfigError(secret)
    shape = Shape(
        **{field.name: getattr(options, field.name) for field in dataclasses.fields(Shape)}
    )
    pod_args = [*options.overrides, "cluster=k8s"]
    run = validate(compose(pod_args), trust=Trust.from_command_line(options.overrides))
    objects = manifests(shape, strategy=run.strategy.name, overrides=options.overrides)
    print(f"# {command_line(['tfrecipe', 'k8s'], args)}\n# kubectl apply -f THIS_FILE")
    print(yaml.safe_dump_all(objects, sort_keys=False), end="")
