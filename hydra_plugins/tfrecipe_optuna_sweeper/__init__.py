"""tfrecipe's Optuna sweeper (`hydra/sweeper=optuna`), found by Hydra in its `hydra_plugins`
namespace; the sweep itself lives in tfrecipe.cli.optuna_study."""
