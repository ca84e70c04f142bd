"""Data: dataset builders (`bundled`: digits, synthetic; `tfds`; the user's own files: `tfrecord`,
`npz`, `image_folder`), each returning `splits.Splits` of unbatched, decoded `(features, label)`
datasets and raising `ValueError` (a config error, exit code 2) naming the dataset or file when
the data cannot be used; the input `pipeline`; and `distribute`, which batches and distributes
them with the strategy."""
