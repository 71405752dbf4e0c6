#!/usr/bin/env python
"""Train any talk_hf model (or a transformers baseline) on data prepared by scripts/preprocess.py.

    python scripts/train.py --data runs/multi30k/data --model talk --preset iwslt-de-en \\
        --set d_model=256 --output_dir runs/multi30k/talk --max_tokens 4096 --max_steps 20000 --test_split test
    accelerate launch scripts/train.py ...            # several GPUs, through Accelerate
    python scripts/train.py ... --resume              # continue exactly from the last checkpoint
    python scripts/train.py ... --init_from runs/wiki1/rfa/model   # start from another run's weights

Writes <output_dir>/metrics.jsonl, metrics.png, checkpoints/step-N/, eval_results.json and model/ (weights, code,
tokenizer, generation config, README.md model card). The card's languages and dataset are --languages and
--dataset_name, else what the data folder's preprocess.json names (a Hub dataset and its --source_lang/--target_lang,
the bundled zh-en corpus, text files named like train.de / train.en; swapped by --reverse); unknown ones are left out.
"""

import argparse
import dataclasses
import json
import re
import sys
from pathlib import Path

from accelerate import PartialState
from transformers import HfArgumentParser

from talk_hf.training.loop import TrainConfig, run_folder_error
from talk_hf.training.model_card import hub_repo_id
from talk_hf.training.models import KINDS, check_preset, parse_overrides
from talk_hf.training.prepare import read_summary
from talk_hf.training.run import train_run

LANGUAGE_CODE = re.compile(r"[a-z]{2}")  # ISO 639-1 (not a column name such as "src", nor a .txt suffix)
FILE_LANGUAGE = re.compile(r"(?P<stem>.+)\.(?P<code>[a-z]{2})")  # train.de


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """The flags' defaults in their help, the description's example commands kept line by line."""


@dataclasses.dataclass
class RunArguments:
    data: str = dataclasses.field(metadata={"help": "folder written by scripts/preprocess.py"})
    model: str = dataclasses.field(metadata={"help": "model kind", "choices": KINDS})
    preset: str = dataclasses.field(default=None, metadata={
        "help": "named hyperparameters of a talk_hf kind, e.g. iwslt-de-en (the baselines take none)"})
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
    languages: list[str] = dataclasses.field(default=None, metadata={
        "help": "the model card's language codes, source first (default: as the data folder's preprocess.json "
                "names them, else none)"})
    dataset_name: str = dataclasses.field(default=None, metadata={
        "help": "the model card's dataset, a Hub dataset id or a name (default: the Hub dataset the data was "
                "prepared from, else none)"})
    license: str = dataclasses.field(default=None, metadata={
        "help": "the model card's license, a Hub license id such as mit or cc-by-4.0 (default: none stated)"})
    push_to_hub: str = dataclasses.field(default=None, metadata={
        "help": "repository id (user/name or org/name) to upload the final model to"})
    hub_revision: str = None
    hub_private: bool = dataclasses.field(default=None, metadata={
        "help": "create the repository private (default: the Hub's default, public unless an organisation's is "
                "private)"})


def parse_args(argv=None):
    """(parser, RunArguments, TrainConfig) of the command line; a usage error (exit 2) for flags that do not fit."""
    parser = HfArgumentParser((RunArguments, TrainConfig), description=__doc__, formatter_class=HelpFormatter)
    try:
        run_args, train_config = parser.parse_args_into_dataclasses(argv)
    except ValueError as err:  # TrainConfig's checks: no --max_steps/--max_epochs/--max_minutes, a bad --schedule ...
        parser.error(str(err))
    try:
        check_preset(run_args.model, run_args.preset)
    except ValueError as err:
        parser.error(f"--preset: {err}")
    if run_args.test_limit < 0:
        parser.error(f"--test_limit must be >= 0 (0: every test example), got {run_args.test_limit}")
    if run_args.push_to_hub is not None and not re.fullmatch(r"[^/\s]+/[^/\s]+", run_args.push_to_hub):
        parser.error(f"--push_to_hub takes a repository id with its namespace, user/name or org/name (the model "
                     f"card's code samples name it), got {run_args.push_to_hub!r}")
    folder_error = run_folder_error(train_config.output_dir, train_config.resume)
    if folder_error is not None:  # a new run into a used folder, --resume without a checkpoint
        parser.error(str(folder_error))
    return parser, run_args, train_config


def read_preparation(parser, data):
    """The ``preprocess.json`` summary of the --data folder; a usage error when the folder holds none."""
    try:
        return read_summary(data)
    except FileNotFoundError as err:
        parser.error(f"--data {err}")


def file_languages(prepared):
    """[source, target] language codes from the names of the text files the data was prepared from, when every
    split's pair is named like ``train.de`` / ``train.en`` (``.gz`` allowed) with the same two codes; else []."""
    pairs = [entry[1:] for entry in prepared.get("splits") or () if isinstance(entry, list) and len(entry) == 3]
    if prepared.get("source_file") and prepared.get("target_file"):
        pairs.append((prepared["source_file"], prepared["target_file"]))
    codes = set()
    for source, target in pairs:
        names = [FILE_LANGUAGE.fullmatch(Path(path).name.removesuffix(".gz")) for path in (source, target)]
        if not all(names) or names[0]["stem"] != names[1]["stem"]:
            return []
        codes.add((names[0]["code"], names[1]["code"]))
    return list(codes.pop()) if len(codes) == 1 else []


def prepared_languages(prepared):
    """[source, target] language codes that the preparation's settings (preprocess.json "args") name: a Hub
    dataset's --source_lang/--target_lang, the bundled zh-en corpus, or the text files' names; swapped by --reverse.
    [] when they name no pair of language codes."""
    if prepared.get("hub_dataset"):
        pair = [prepared.get("source_lang"), prepared.get("target_lang")]
    elif prepared.get("wiki_zh_en"):
        pair = ["zh", "en"]
    else:
        pair = file_languages(prepared)
    if len(pair) != 2 or len(set(pair)) != 2 or not all(LANGUAGE_CODE.fullmatch(str(code)) for code in pair):
        return []
    return pair[::-1] if prepared.get("reverse") else pair


def card_values(run_args, prepared):
    """The model card's keyword arguments (talk_hf.training.model_card.write_model_card): languages and datasets
    from the flags, else from the preparation's settings, else none; license; the --init_from folder as the base
    model; the --push_to_hub repository (else the code samples name a placeholder)."""
    dataset = run_args.dataset_name or hub_repo_id(prepared.get("hub_dataset"))
    card = {"languages": run_args.languages or prepared_languages(prepared), "datasets": [dataset] if dataset else [],
            "license": run_args.license, "base_model": run_args.init_from}
    if run_args.push_to_hub:
        card["repo_id"] = run_args.push_to_hub  # the card's code samples then name the repository
    return card


def main(argv=None):
    parser, run_args, train_config = parse_args(argv)
    try:
        overrides = parse_overrides(run_args.set)
    except ValueError as err:
        parser.error(f"--set: {err}")
    prepared = read_preparation(parser, run_args.data).get("args", {})
    results = train_run(
        run_args.data, run_args.model, train_config, preset=run_args.preset, config_file=run_args.config,
        overrides=overrides, train_split=run_args.train_split, valid_split=run_args.valid_split,
        test_split=run_args.test_split, document_level=run_args.document_level,
        card=card_values(run_args, prepared), test_limit=run_args.test_limit, init_from=run_args.init_from,
    )
    print(json.dumps(results, indent=2))
    if run_args.push_to_hub and PartialState().is_main_process:  # the process that wrote the model folder
        from talk_hf.training.hub import push_run

        url = push_run(f"{train_config.output_dir}/model", run_args.push_to_hub, revision=run_args.hub_revision,
                       private=run_args.hub_private)
        print(f"pushed to {url}")
    return results


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    # e.g. a config field the model kind does not take, found as the model is built; a missing split
    except (ValueError, FileExistsError, FileNotFoundError) as err:
        sys.exit(f"train.py: error: {err}")
