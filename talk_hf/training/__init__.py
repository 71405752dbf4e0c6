"""Training, evaluation and sharing tools: corpus readers (`corpora`), tokenizer training, encoding and token
batching (`data`), prepared data folders (`prepare`), an Accelerate training loop (`loop`, `run`), sacreBLEU
evaluation, checkpoint averaging, model cards and Hub upload. Not needed to use a model, and never copied as Hub
remote code; the `scripts/` CLIs are thin wrappers over these modules."""
