"""Configuration: composing the Hydra configs, the typed schema, and the one allow-listed way a
config becomes objects."""
