"""Training loops. Each takes built objects (model, distributed datasets, callbacks), never config."""
