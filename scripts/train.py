#!/usr/bin/env python
"""Train any talk_hf model (or a transformers baseline) on data prepared by scripts/preprocess.py.

    python scripts/train.py --data runs/multi30k/data --model talk --preset iwslt-de-en \
        --set d_model=256 --output_dir runs/multi30k/talk --max_tokens 4096 --max_steps 20000 --test_split test
    accelerate launch scripts/train.py ...            # several GPUs, through Accelerate
    python scripts/train.py ... --resume              # continue exactly from the last checkpoint
    python scripts/train.py ... --init_from runs/wiki1/rfa/model   # start from another run's weights

Writes <output_dir>/metrics.jsonl, metrics.png, checkpoints/step-N/, eval_results.json and model/ (weights, code,
tokenizer, generation config, README.md model card).
"""

import dataclasses
import json
import sys

from transformers import HfArgumentParser

from talk_hf.training.loop import TrainConfig
from talk_hf.training.models import KINDS, parse_overrides
from talk_hf.training.run import train_run


@dataclasses.dataclass
class RunArguments:
    data: str = dataclasses.field(metadata={"help": "folder written by scripts/preprocess.py"})
    model: str = dataclasses.field(metadata={"help": f"model kind: {', '.join(KINDS)}"})
    preset: str = dataclasses.field(default=None, metadata={"help": "named hyperparameters, e.g. iwslt-de-en"})
    config: str = dataclasses.field(default=None, metadata={"help": "JSON file of config fields"})
    set: list[str] = dataclasses.field(default_factory=list, metadata={
        "action": "extend", "help": "config overrides field=value (repeated --set flags add up; a field given twice "
                                    "is an error)"})
    train_split: str = "train"
    valid_split: str = "valid"
    test_split: str = dataclasses.field(default=None, metadata={"help": "split to translate and score at the end"})
    document_level: bool = dataclasses.field(default=False, metadata={"help": "score the last sentence per window"})
    test_limit: int = dataclasses.field(default=0, metadata={"help": "score only the first N test examples"})
    init_from: str = dataclasses.field(default=None, metadata={
        "help": "a saved model folder whose weights start training (e.g. a sentence-level run's model/)"})
    languages: list[str] = dataclasses.field(default_factory=lambda: ["de", "en"], metadata={"help": "for the card"})
    dataset_name: str = dataclasses.field(default="multi30k", metadata={"help": "for the model card"})
    push_to_hub: str = dataclasses.field(default=None, metadata={"help": "repo id to upload the final model to"})
    hub_revision: str = None
    hub_private: bool = False


def main(argv=None):
    parser = HfArgumentParser((RunArguments, TrainConfig), description=__doc__)
    run_args, train_config = parser.parse_args_into_dataclasses(argv)
    try:
        overrides = parse_overrides(run_args.set)
    except ValueError as err:
        parser.error(f"--set: {err}")
    card = {"languages": run_args.languages, "datasets": [run_args.dataset_name]}
    if run_args.push_to_hub:
        card["repo_id"] = run_args.push_to_hub  # the card's code samples then name the repository
    results = train_run(
        run_args.data, run_args.model, train_config, preset=run_args.preset, config_file=run_args.config,
        overrides=overrides, train_split=run_args.train_split, valid_split=run_args.valid_split,
        test_split=run_args.test_split, document_level=run_args.document_level, card=card,
        test_limit=run_args.test_limit, init_from=run_args.init_from,
    )
    print(json.dumps(results, indent=2))
    if run_args.push_to_hub:
        from talk_hf.training.hub import push_run

        url = push_run(f"{train_config.output_dir}/model", run_args.push_to_hub, revision=run_args.hub_revision,
                       private=run_args.hub_private)
        print(f"pushed to {url}")
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
