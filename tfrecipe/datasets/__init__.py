"""Dataset builders beyond the bundled ones: TFDS (`tfds`) and the user's own files (`tfrecord`,
`npz`, `image_folder`). Each returns `tfrecipe.data.Splits` of unbatched, decoded
`(features, label)` datasets and raises `ValueError` (a config error, exit code 2) naming the
dataset or file when the data cannot be used."""
