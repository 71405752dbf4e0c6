"""Training, evaluation and sharing tools (datasets preprocessing, an Accelerate training loop, sacreBLEU
evaluation, checkpoint averaging, model cards, Hub upload). Not needed to use a model, and never copied as Hub
remote code; the `scripts/` CLIs are thin wrappers over these modules."""
