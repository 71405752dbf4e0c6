"""An Accelerate training loop for talk_hf models and the transformers baselines.

Token-budget batches (`max_tokens`), gradient accumulation, fp16/bf16, multi-GPU through `accelerate launch`,
Adam with inverse-sqrt or cosine-with-warmup schedules, label smoothing, periodic validation loss and BLEU (and,
for encoder-decoders, the loss the right sources save over swapped ones: it shows an encoder that stopped reading),
early stopping when the validation loss stops improving, a JSONL metrics log and a plot, checkpoints that resume exactly
(same next batch, same loss), and averaging of the last checkpoints.
"""

import dataclasses
import json
import math
import os
import shutil
import time
import warnings
from pathlib import Path

import pyarrow.compute as pc
import torch
import torch.nn.functional as F
from accelerate import Accelerator, PartialState
from accelerate.utils import parse_flag_from_env, set_seed
from safetensors.torch import load_file
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import get_cosine_schedule_with_warmup

from ..document_translation import position_limits
from .data import Seq2SeqCollator, TokenBatchSampler, pad_right
from .evaluation import corpus_bleu, eval_mode, perplexity, scoring, translate

SCHEDULES = ("inverse_sqrt", "cosine")
# field -> (lowest value, highest value or None, whether the lowest is excluded): the values TrainConfig takes (0
# where it means none or no limit); warmup_steps depends on the schedule (TrainConfig.least_warmup)
FIELD_RANGES = {
    "max_tokens": (1, None, False), "max_steps": (0, None, False), "max_epochs": (0, None, False),
    "max_minutes": (0, None, False), "gradient_accumulation_steps": (1, None, False),
    "learning_rate": (0, None, True), "warmup_init_lr": (0, None, False), "adam_beta1": (0, 1, False),
    "adam_beta2": (0, 1, False), "weight_decay": (0, None, False), "clip_norm": (0, None, False),
    "label_smoothing": (0, 1, False), "log_every": (1, None, False), "eval_every": (0, None, False),
    "save_every": (0, None, False), "bleu_sentences": (0, None, False), "num_beams": (1, None, False),
    "max_new_tokens": (1, None, False),
}


def check_range(name, value, low, high=None, strict=False, why=""):
    """A ValueError naming the field and its range when `value` lies outside it (NaN included): >= low (> low when
    `strict`) and, when `high` is given, < high; `why`: added to the message."""
    inside = (value > low if strict else value >= low) and (high is None or value < high)
    if not inside:
        bounds = f"{'>' if strict else '>='} {low}" + (f" and < {high}" if high is not None else "")
        raise ValueError(f"{name} must be {bounds}{why}, got {value!r}")


@dataclasses.dataclass
class TrainConfig:
    output_dir: str
    max_tokens: int = 4096
    max_steps: int = 0  # optimizer updates; 0: no limit (then max_epochs or max_minutes must stop training)
    max_epochs: int = 0
    max_minutes: float = 0.0
    gradient_accumulation_steps: int = 1
    learning_rate: float = 5e-4
    schedule: str = "inverse_sqrt"
    warmup_steps: int = 4000
    warmup_init_lr: float = 1e-7
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    weight_decay: float = 1e-4
    clip_norm: float = 0.0
    # for models whose loss has no smoothing setting of its own (the encoder-decoders, the baselines); the talk_hf
    # causal LMs take it from their config (`label_smoothing`), and setting it here too is refused
    label_smoothing: float = 0.0
    mixed_precision: str = "no"
    seed: int = 1
    log_every: int = 50
    eval_every: int = 0  # steps; 0: only at the end
    # early stopping: stop after this many periodic evaluations in a row without a new lowest validation loss
    # (0: never; needs eval_every)
    patience: int = 0
    save_every: int = 0  # steps; 0: only at the end
    keep_checkpoints: int = 5
    average_last: int = 0  # average the weights of the last N checkpoints into the final model
    bleu_sentences: int = 500  # validation sentences translated for BLEU during training (0: none)
    num_beams: int = 4
    max_new_tokens: int = 128
    resume: bool = False

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        for name, (low, high, strict) in FIELD_RANGES.items():
            check_range(name, getattr(self, name), low, high, strict)
        check_range("warmup_steps", self.warmup_steps, self.least_warmup(), why=f" with the {self.schedule} schedule")
        if not (self.max_steps or self.max_epochs or self.max_minutes):
            raise ValueError("set at least one of max_steps, max_epochs and max_minutes")
        if self.patience < 0 or (self.patience and not self.eval_every):
            raise ValueError(f"patience={self.patience} needs patience >= 0 and eval_every > 0 (the evaluations it "
                             f"counts), got eval_every={self.eval_every}")
        if self.keep_checkpoints < 1 or self.average_last < 0:
            raise ValueError(f"keep_checkpoints must be >= 1 and average_last >= 0, got {self.keep_checkpoints} and "
                             f"{self.average_last}")
        if self.average_last > self.keep_checkpoints:
            raise ValueError(f"average_last={self.average_last} needs keep_checkpoints >= it ({self.keep_checkpoints})")
        if self.average_last > 1 and not self.save_every:
            raise ValueError(f"average_last={self.average_last} averages the last checkpoints: it needs save_every > 0 "
                             "(without it a run saves only its last one)")

    def least_warmup(self):
        """The shortest warm-up the schedule takes: inverse_sqrt scales by it (0 keeps the learning rate at 0), cosine
        may start at its peak."""
        return 1 if self.schedule == "inverse_sqrt" else 0

    def run_settings(self):
        """The fields that define a run's trajectory: a resumed run must keep them (RUN_SETTINGS)."""
        return {name: getattr(self, name) for name in RUN_SETTINGS}


# what a resumed run may not change: the batches, the optimiser and its schedule, the loss, the precision, the seed
# (the limits, evaluation, checkpointing and test-time settings may change)
RUN_SETTINGS = ("max_tokens", "gradient_accumulation_steps", "learning_rate", "schedule", "warmup_steps",
                "warmup_init_lr", "adam_beta1", "adam_beta2", "weight_decay", "clip_norm", "label_smoothing",
                "mixed_precision", "seed")
RUN_FILE = "run_settings.json"  # in the run folder: RUN_SETTINGS, the model's config, the training data's size
METRICS_FILE = "metrics.jsonl"  # in the run folder: one JSON record per line, each with the update ("step")
# model config fields that leave the model's function as it is: where it was loaded from, the library version,
# the outputs a forward returns (not what RUN_FILE compares)
MODEL_BOOKKEEPING = ("_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "use_cache",
                     "output_attentions", "output_hidden_states", "return_dict")
RESUME_POINT_FILE = "resume_point"  # in a checkpoint saved off the save_every schedule, where a run stopped


@dataclasses.dataclass
class TrainerState:
    """Where training is; checkpointed with the model, optimizer, scheduler and RNG states."""

    global_step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch already consumed (on this process)
    elapsed_seconds: float = 0.0
    micro_step: int = 0  # Accelerate's accumulation counter: it decides which batches form the next update
    best_valid_loss: float = math.inf  # the lowest validation loss of the periodic evaluations so far
    best_step: int = 0  # the update where it was reached
    evals_since_best: int = 0  # periodic evaluations since then (early stopping at config.patience)

    def state_dict(self):
        return dataclasses.asdict(self)

    def load_state_dict(self, state):
        for key, value in state.items():
            setattr(self, key, value)


def inverse_sqrt_schedule(optimizer, warmup_steps, warmup_init_lr):
    """fairseq's inverse_sqrt: linear warm-up from warmup_init_lr to the peak lr, then peak * sqrt(warmup / step)."""
    peak = optimizer.param_groups[0]["lr"]

    def factor(step):
        step = step + 1
        if step < warmup_steps:
            return (warmup_init_lr + (peak - warmup_init_lr) * step / warmup_steps) / peak
        return math.sqrt(warmup_steps / step)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def make_scheduler(optimizer, config, total_steps):
    if config.schedule == "cosine":
        if not total_steps:
            raise ValueError("the cosine schedule needs max_steps")
        return get_cosine_schedule_with_warmup(optimizer, config.warmup_steps, total_steps)
    return inverse_sqrt_schedule(optimizer, config.warmup_steps, config.warmup_init_lr)


def model_config(model):
    """The config of a model, also when it is wrapped (DistributedDataParallel under `accelerate launch`)."""
    return getattr(model, "module", model).config


def is_causal_lm(model):
    return not model_config(model).is_encoder_decoder


def lm_collate(examples, pad_token_id):
    """Causal-LM examples {"input_ids", "labels"} -> right-padded tensors with an attention mask."""
    ids = [torch.as_tensor(e["input_ids"], dtype=torch.long) for e in examples]
    return {"input_ids": pad_right(ids, pad_token_id),
            "attention_mask": pad_right([torch.ones_like(i) for i in ids], 0),
            "labels": pad_right([torch.as_tensor(e["labels"], dtype=torch.long) for e in examples], -100)}


def make_collator(model):
    config = model_config(model)
    if is_causal_lm(model):
        return lambda examples: lm_collate(examples, config.pad_token_id)
    return Seq2SeqCollator(config.pad_token_id, config.decoder_start_token_id)


def own_label_smoothing(model):
    """The label smoothing a model's own loss applies (the talk_hf causal LMs' config.label_smoothing), or None for
    a model whose loss has no such setting."""
    return getattr(model_config(model), "label_smoothing", None)


def check_label_smoothing(model, label_smoothing):
    """Label smoothing is configured in one place: the model config for a model whose loss applies it, else the
    training config. Both set raises ValueError naming them."""
    if own_label_smoothing(model) is not None and label_smoothing:
        raise ValueError(
            f"this model's loss applies its config's label_smoothing ({own_label_smoothing(model)}); set it there, "
            f"not in the training config (label_smoothing={label_smoothing}, leave it 0)"
        )


def training_loss(model, batch, label_smoothing=0.0, num_items=None):
    """The loss a training step minimises: the model's own (labels passed to its forward, with its config's label
    smoothing) for a model whose loss has a smoothing setting, else `token_loss` with `label_smoothing`; the mean
    over the batch's target tokens, or with `num_items` their sum divided by it (transformers' `num_items_in_batch`:
    the target tokens of a whole update, so that micro-batches and processes weigh by their tokens)."""
    if own_label_smoothing(model) is None:
        if num_items is None:
            return token_loss(model, batch, label_smoothing)
        return token_loss(model, batch, label_smoothing, reduction="sum") / num_items
    return model(**batch, use_cache=False, num_items_in_batch=num_items).loss


def target_tokens(model, batch):
    """How many target tokens a batch's loss counts (a 0-dim tensor): labels other than -100 (a causal LM's first
    position has no target)."""
    labels = batch["labels"][:, 1:] if is_causal_lm(model) else batch["labels"]
    return (labels != -100).sum()


def token_loss(model, batch, label_smoothing=0.0, reduction="mean"):
    """Cross-entropy of a collated batch (labels -100 ignored); causal LMs predict the next token."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs, use_cache=False).logits
    labels = batch["labels"]
    if is_causal_lm(model):
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=label_smoothing,
        reduction=reduction,
    )


def _columns(dataset):
    return [c for c in dataset.column_names if c in ("input_ids", "labels")]


def _loader(dataset, batches, collator):
    # Its own generator: a DataLoader iterator otherwise draws its base seed from the global RNG, which would
    # shift every later dropout mask whenever a run creates one iterator more or less (e.g. after resuming).
    return DataLoader(dataset.with_format(columns=_columns(dataset)), batch_sampler=batches, collate_fn=collator,
                      generator=torch.Generator())


@dataclasses.dataclass
class LossSums:
    """The sums of one validation pass (`summed_losses`): cross-entropy over every target token, and the source
    gain's, over the batches where it was measured."""

    total: float = 0.0
    tokens: int = 0
    gain_total: float = 0.0  # loss with swapped sources minus loss with the right ones, summed
    gain_tokens: int = 0

    @property
    def loss(self):
        return self.total / max(self.tokens, 1)

    @property
    def source_gain(self):
        return self.gain_total / max(self.gain_tokens, 1)


def _rolled_sources(batch):
    """The batch with each row's source taken from the row before it (the first from the last)."""
    return dict(batch, input_ids=batch["input_ids"].roll(1, 0), attention_mask=batch["attention_mask"].roll(1, 0))


@torch.no_grad()
def summed_losses(model, dataset, collator, max_tokens, accelerator=None, swap_sources=False):
    """One pass over a dataset in token-budget batches -> LossSums: the cross-entropy (no smoothing) of every target
    token and, with swap_sources (an encoder-decoder), the source gain's sums: on each batch of two rows or more,
    the loss with every source swapped for another row's minus the loss with the right ones. Runs in `eval_mode`."""
    if swap_sources and is_causal_lm(model):
        raise ValueError("the source gain needs an encoder-decoder: a causal LM has no source")
    batches = TokenBatchSampler(dataset["num_tokens"], max_tokens, shuffle=False).batches(0)
    sums = LossSums()
    device = accelerator.device if accelerator is not None else next(model.parameters()).device
    with eval_mode(model):
        for batch in _loader(dataset, batches, collator):
            batch = {k: v.to(device) for k, v in batch.items()}
            right = token_loss(model, batch, reduction="sum").item()
            tokens = int(target_tokens(model, batch))
            sums.total, sums.tokens = sums.total + right, sums.tokens + tokens
            if swap_sources and len(batch["labels"]) > 1:  # a lone row has no other source to take
                sums.gain_total += token_loss(model, _rolled_sources(batch), reduction="sum").item() - right
                sums.gain_tokens += tokens
    return sums


def validation_loss(model, dataset, collator, max_tokens, accelerator=None):
    """Token-weighted mean cross-entropy (no smoothing) over a dataset -> (loss, tokens)."""
    sums = summed_losses(model, dataset, collator, max_tokens, accelerator)
    return sums.loss, sums.tokens


def source_gain(model, dataset, collator, max_tokens, accelerator=None):
    """What the source is worth to an encoder-decoder: its validation loss with every source swapped for another
    row's (each batch's sources rolled by one row) minus its loss with the right sources, token-weighted, over the
    batches of two rows or more -> (nats per target token, target tokens counted).

    A model that translates has a gain of several nats; a model whose encoder output no longer depends on its input
    (a collapsed encoder) has a gain of about 0, while its validation loss can go on falling as a language model
    of the targets.
    """
    sums = summed_losses(model, dataset, collator, max_tokens, accelerator, swap_sources=True)
    return sums.source_gain, sums.gain_tokens


def checkpoints(output_dir):
    """Saved checkpoints, oldest first."""
    folder = Path(output_dir) / "checkpoints"
    found = [p for p in folder.glob("step-*") if p.is_dir()] if folder.exists() else []
    return sorted(found, key=checkpoint_step)


def checkpoint_step(path):
    """checkpoints/step-N -> N."""
    return int(Path(path).name.split("-")[1])


def scheduled_checkpoints(output_dir):
    """A run's checkpoints but the resume points before its newest one (saved off the save_every schedule where an
    earlier part of the run stopped): those an uninterrupted run has (`Trainer.prune_checkpoints`)."""
    found = checkpoints(output_dir)
    return [p for p in found[:-1] if not (p / RESUME_POINT_FILE).exists()] + found[-1:]


def run_folder_error(output_dir, resume):
    """Why a run cannot train into `output_dir` -> the exception to raise, or None: a resumed run needs a checkpoint
    there (FileNotFoundError), a new one a folder without an earlier run, whose checkpoints and metrics it would mix
    with its own (FileExistsError)."""
    output_dir = Path(output_dir)
    if resume and not checkpoints(output_dir):
        return FileNotFoundError(f"--resume: no checkpoint under {output_dir / 'checkpoints'}")
    if not resume and checkpoints(output_dir):
        return FileExistsError(f"{output_dir} holds an earlier run (checkpoints/, {METRICS_FILE}): continue it with "
                               "resume (--resume), or train into another output_dir")
    if not resume and (output_dir / METRICS_FILE).exists():
        return FileExistsError(f"{output_dir} holds the {METRICS_FILE} of an earlier run that saved no checkpoint "
                               f"(nothing to resume): remove {output_dir / METRICS_FILE} to train afresh there, or "
                               "train into another output_dir")
    return None


def drop_records_after(metrics_path, step):
    """Remove from a metrics log the records of updates after `step`, and a last line cut off part-way: what a run
    stopped after its last checkpoint logged, and its resumed run logs again. The other lines stay as they are."""
    path = Path(metrics_path)
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if line.endswith("\n") and json.loads(line).get("step", 0) <= step]
    if kept != lines:
        partial = path.with_name(f".{path.name}.partial")
        partial.write_text("".join(kept))
        os.replace(partial, path)  # a process killed while writing leaves the log whole


def model_settings(model):
    """The fields of a model's config but MODEL_BOOKKEEPING, as JSON values (what RUN_FILE records as "model")."""
    config = json.loads(model_config(model).to_json_string(use_diff=False))
    return {key: value for key, value in config.items() if key not in MODEL_BOOKKEEPING}


def flat_settings(record):
    """A RUN_FILE record with each model config field as a setting of its own, named model.<field>."""
    settings = {key: value for key, value in record.items() if key != "model"}
    return {**settings, **{f"model.{key}": value for key, value in record.get("model", {}).items()}}


def average_checkpoints(paths):
    """Element-wise mean of the model weights of several checkpoints -> {name: tensor}, each in its dtype.
    A tensor equal in every checkpoint (a fixed random projection, frozen positions) is copied unchanged; other
    floating tensors are summed in fp64; other tensors (integers, booleans) have no mean and must be equal.

    Raises:
        ValueError: no checkpoints; one whose weight names, or a tensor's shape or dtype, differ from the first's;
        an integer or boolean tensor that differs between checkpoints.
    """
    if not paths:
        raise ValueError("no checkpoints to average")
    states = [load_file(str(Path(p) / "model.safetensors")) for p in paths]
    first = states[0]
    for path, state in zip(paths[1:], states[1:]):
        if state.keys() != first.keys():
            raise ValueError(f"{path} holds different weights than {paths[0]}")
        for key, value in state.items():
            if (value.shape, value.dtype) != (first[key].shape, first[key].dtype):
                raise ValueError(f"{path}: {key} is {tuple(value.shape)} {value.dtype}, but {tuple(first[key].shape)} "
                                 f"{first[key].dtype} in {paths[0]}")
    return {key: _mean_tensor(key, [state[key] for state in states], paths) for key in first}


def _mean_tensor(key, tensors, paths):
    """The mean of one weight's tensors (same shape and dtype) across checkpoints; one equal in all, itself."""
    differs = next((p for p, t in zip(paths[1:], tensors[1:]) if not torch.equal(t, tensors[0])), None)
    if differs is None:
        return tensors[0]
    if tensors[0].is_floating_point():
        return sum(t.double() for t in tensors).div(len(tensors)).to(tensors[0].dtype)
    raise ValueError(f"{key} is {tensors[0].dtype}, which has no mean, and {differs} holds other values than "
                     f"{paths[0]}")


def check_positions(config, sets, max_new_tokens):
    """Refuses what a model with a fixed-size position table (transformers' Marian, BART: max_position_embeddings;
    GPT-2: n_positions) cannot embed: an example of `sets` ((name, Dataset) pairs) longer than the table, or, for an
    encoder-decoder, a generation of up to max_new_tokens (decoder inputs: the start token and all but the last
    generated token). The talk_hf models' sinusoids have no limit."""
    encoder, decoder = position_limits(config)
    seq2seq = config.is_encoder_decoder
    columns = [("input_ids", encoder, "source "), ("labels", decoder, "target ")] if seq2seq else [
        ("input_ids", decoder, "")]
    columns = [(column, limit, side) for column, limit, side in columns if limit is not None]
    for name, dataset in sets if columns else ():
        table = dataset.select_columns([column for column, _, _ in columns]).with_format("arrow")[:]
        for column, limit, side in columns:
            longest = pc.max(pc.list_value_length(table[column])).as_py()
            if longest > limit:
                raise ValueError(f"a {name} example has {longest} {side}tokens, more than the model's {limit} "
                                 "positions (its max_position_embeddings): prepare the data with a lower "
                                 "max_tokens_per_example, or give the model more positions")
    if seq2seq and decoder is not None and max_new_tokens > decoder:
        raise ValueError(f"max_new_tokens={max_new_tokens} can outgrow the model's {decoder} decoder positions (its "
                         f"max_position_embeddings): validation and the saved model's generation config would fail "
                         f"past them; use max_new_tokens <= {decoder}")


class Trainer:
    """Owns the accelerator, the optimisation state and the run folder (metrics.jsonl, checkpoints/, model/)."""

    def __init__(self, model, tokenizer, train_dataset, valid_dataset, config, valid_texts=None):
        for name, dataset in (("training", train_dataset), ("validation", valid_dataset)):
            if len(dataset) == 0:
                raise ValueError(f"the {name} set is empty")
        longest = max(valid_dataset["num_tokens"][:])
        if longest > config.max_tokens:
            raise ValueError(f"a validation example has {longest} tokens, more than max_tokens={config.max_tokens} "
                             "(a batch's budget): raise max_tokens, or prepare the data with a lower "
                             "max_tokens_per_example")
        check_positions(model.config, (("training", train_dataset), ("validation", valid_dataset)),
                        config.max_new_tokens)
        self.config, self.tokenizer = config, tokenizer
        self.train_dataset, self.valid_dataset, self.valid_texts = train_dataset, valid_dataset, valid_texts
        self.output_dir = Path(config.output_dir)
        cpu = parse_flag_from_env("ACCELERATE_USE_CPU")  # `accelerate launch --cpu`, as Accelerator reads it
        if config.mixed_precision == "fp16" and PartialState(cpu=cpu).device.type == "cpu":
            raise ValueError("mixed_precision='fp16' does not run on a CPU (Accelerate autocasts fp16 only on "
                             "accelerators): the run would train in fp32; use 'bf16' or 'no'")
        # the schedule counts updates: stepped once per update here (Accelerate's default steps it once per process)
        self.accelerator = Accelerator(
            mixed_precision=config.mixed_precision, gradient_accumulation_steps=config.gradient_accumulation_steps,
            step_scheduler_with_optimizer=False,
        )
        check_label_smoothing(model, config.label_smoothing)
        set_seed(config.seed)
        self.collator = make_collator(model)
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.weight_decay
        )
        scheduler = make_scheduler(optimizer, config, config.max_steps)
        self.model, self.optimizer, self.scheduler = self.accelerator.prepare(model, optimizer, scheduler)
        self.state = TrainerState()
        self.accelerator.register_for_checkpointing(self.state)
        self.sampler = TokenBatchSampler(train_dataset["num_tokens"], config.max_tokens, shuffle=True, seed=config.seed)
        self.metrics_path = self.output_dir / METRICS_FILE

    # -- bookkeeping ------------------------------------------------------------------------------------------

    def log(self, record):
        if self.accelerator.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            with open(self.metrics_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def save_checkpoint(self, resume_point=False):
        """checkpoints/step-N, written as partial-step-N and renamed once every process has written its part: a
        process killed while saving leaves no incomplete step-N for --resume to load. resume_point: a checkpoint
        saved off the save_every schedule, where the run stopped (marked by RESUME_POINT_FILE; see
        prune_checkpoints)."""
        folder = self.output_dir / "checkpoints"
        path, partial = folder / f"step-{self.state.global_step}", folder / f"partial-step-{self.state.global_step}"
        self.state.micro_step = self.accelerator.step
        self.accelerator.save_state(str(partial))
        self.accelerator.wait_for_everyone()  # every process has written its part before it is renamed
        if self.accelerator.is_main_process:
            if resume_point:
                (partial / RESUME_POINT_FILE).touch()
            shutil.rmtree(path, ignore_errors=True)
            partial.rename(path)
        self.accelerator.wait_for_everyone()  # step-N exists for every process before old ones are removed
        if self.accelerator.is_main_process:
            self.prune_checkpoints()
        return path

    def prune_checkpoints(self):
        """Keep the last keep_checkpoints checkpoints, the newest among them, leaving out the resume points before
        it: a checkpoint saved off the save_every schedule where a run stopped (max_steps, max_minutes, patience) is
        only a point to resume from, removed once a later one exists, so a resumed run keeps and averages the
        checkpoints an uninterrupted one would. The best checkpoint is kept too where patience may stop the run (it
        may end with it)."""
        scheduled = scheduled_checkpoints(self.output_dir)
        resume_points = [p for p in checkpoints(self.output_dir) if p not in scheduled]
        best = self.best_checkpoint() if self.config.patience else None
        for old in resume_points + scheduled[: -self.config.keep_checkpoints]:
            if old != best:
                shutil.rmtree(old)

    def best_checkpoint(self):
        """The checkpoint folder of the lowest periodic validation loss (it may not exist)."""
        return self.output_dir / "checkpoints" / f"step-{self.state.best_step}"

    def run_record(self):
        """RUN_SETTINGS, the processes (each takes its own batches), the training data's size, the model's config
        (`model_settings`: its kind and sizes, dropout ...), and for the cosine schedule its length: what RUN_FILE
        holds."""
        record = {**self.config.run_settings(), "num_processes": self.accelerator.num_processes,
                  "train_examples": len(self.train_dataset),
                  "train_tokens": int(sum(self.train_dataset["num_tokens"][:])), "model": model_settings(self.model)}
        if self.config.schedule == "cosine":  # its decay spans max_steps
            record["max_steps"] = self.config.max_steps
        return record

    def start_fresh(self):
        """A new run: its folder must hold no earlier run (whose checkpoints and metrics it would mix with its own);
        records RUN_FILE."""
        error = run_folder_error(self.output_dir, resume=False)
        if error is not None:
            raise error
        self.accelerator.wait_for_everyone()  # every process has looked before the main one writes
        if self.accelerator.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            (self.output_dir / RUN_FILE).write_text(json.dumps(self.run_record(), indent=2) + "\n")

    def check_resumed_settings(self):
        """A resumed run keeps RUN_SETTINGS, its model's config and its training data (as RUN_FILE recorded them,
        where it exists)."""
        path = self.output_dir / RUN_FILE
        if not path.exists():
            return
        recorded, now = flat_settings(json.loads(path.read_text())), flat_settings(self.run_record())
        changed = {k: (recorded[k], now[k]) for k in now if k in recorded and recorded[k] != now[k]}
        if changed:
            raise ValueError(f"resume: the run in {self.output_dir} was started with other settings or data "
                             + ", ".join(f"{k} {old!r} (now {new!r})" for k, (old, new) in changed.items())
                             + "; resume with the same ones, or train into another output_dir")

    def resume(self):
        """Load the last checkpoint (after checking the run's settings) -> its folder. The metrics log loses what the
        run logged after it (`drop_records_after`): the resumed run logs those updates again."""
        error = run_folder_error(self.output_dir, resume=True)
        if error is not None:
            raise error
        found = checkpoints(self.output_dir)
        self.check_resumed_settings()
        if self.accelerator.is_main_process:  # what a process killed while saving left
            for partial in (self.output_dir / "checkpoints").glob("partial-step-*"):
                shutil.rmtree(partial)
        self.accelerator.load_state(str(found[-1]))
        self.accelerator.step = self.state.micro_step
        self.check_schedule_position(found[-1])
        if self.accelerator.is_main_process:
            drop_records_after(self.metrics_path, self.state.global_step)
        return found[-1]

    def check_schedule_position(self, checkpoint):
        """The learning-rate schedule steps once per update (none for an update whose optimizer step was skipped):
        a checkpoint whose schedule is past its update count (one from a loop that stepped it once per process) is
        refused, as resuming it would continue another schedule than the run's."""
        position = self.scheduler.scheduler.last_epoch
        if position > self.state.global_step:
            raise ValueError(f"{checkpoint}: its learning-rate schedule is at step {position} after "
                             f"{self.state.global_step} updates (a schedule stepped once per process per update); "
                             "this run cannot continue it: train it again into another output_dir")

    def done(self):
        c, s = self.config, self.state
        return (
            (c.max_steps and s.global_step >= c.max_steps)
            or (c.max_epochs and s.epoch >= c.max_epochs)
            or (c.max_minutes and self.longest_training_time() >= 60 * c.max_minutes)
            or self.stopped_early()
        )

    def longest_training_time(self):
        """Seconds trained by the process that has trained longest: each process reads its own clock, and all must
        stop at the same update (the time cap is judged on the same number everywhere)."""
        if self.accelerator.num_processes == 1:
            return self.state.elapsed_seconds
        clock = torch.tensor([self.state.elapsed_seconds], device=self.accelerator.device)
        return self.accelerator.gather(clock).max().item()

    def stopped_early(self):
        """The validation loss has not improved for config.patience periodic evaluations."""
        return bool(self.config.patience) and self.state.evals_since_best >= self.config.patience

    # -- evaluation -------------------------------------------------------------------------------------------

    def evaluate(self, **fields):
        """Validation loss (and BLEU with bleu_sentences, and the source gain of an encoder-decoder) of the current
        weights, logged with `fields` -> the record."""
        model = self.accelerator.unwrap_model(self.model)
        seq2seq = not is_causal_lm(model)
        sums = summed_losses(model, self.valid_dataset, self.collator, self.config.max_tokens, self.accelerator,
                             swap_sources=seq2seq)
        record = {"step": self.state.global_step, "epoch": self.state.epoch, "valid_loss": sums.loss,
                  "valid_ppl": perplexity(sums.loss)}
        if seq2seq:
            record["valid_source_gain"] = sums.source_gain
        if self.valid_texts is not None and self.config.bleu_sentences and seq2seq:
            sources, references = self.valid_texts
            n = self.config.bleu_sentences
            hyps = translate(model, self.tokenizer, sources[:n], num_beams=self.config.num_beams,
                             max_new_tokens=self.config.max_new_tokens)
            references, options = scoring(self.tokenizer, references[:n])
            record["valid_bleu"] = corpus_bleu(hyps, references, **options)[0]
        record.update(fields)
        self.log(record)
        return record

    # -- training ----------------------------------------------------------------------------------------------

    def train_epoch(self, progress):
        batches = self.sampler.batches(self.state.epoch)
        if self.state.batch_in_epoch >= len(batches):  # stopped right at the end of this epoch
            self.state.epoch, self.state.batch_in_epoch = self.state.epoch + 1, 0
            return
        loader = self.accelerator.prepare(_loader(self.train_dataset, batches, self.collator))
        loader = self.accelerator.skip_first_batches(loader, self.state.batch_in_epoch)
        start = time.monotonic() - self.state.elapsed_seconds
        update = torch.zeros(2, dtype=torch.float64, device=self.accelerator.device)  # this process: loss sum, tokens
        for batch in loader:
            with self.accelerator.accumulate(self.model):
                self.backward(batch, update)
                if self.accelerator.sync_gradients:
                    update = self.accelerator.reduce(update, reduction="sum")  # every process's micro-batches
                    tokens = max(update[1].item(), 1)
                    self.scale_gradients(self.config.max_tokens * self.accelerator.num_processes / tokens)
                    if self.config.clip_norm > 0:
                        self.accelerator.clip_grad_norm_(self.model.parameters(), self.config.clip_norm)
                    lr = self.scheduler.get_last_lr()[0]  # this update's (the schedule steps after it)
                self.optimizer.step()
                if self.accelerator.sync_gradients and not self.accelerator.optimizer_step_was_skipped:
                    self.scheduler.step()
                self.optimizer.zero_grad()
            self.state.batch_in_epoch += 1
            self.state.elapsed_seconds = time.monotonic() - start
            if self.accelerator.sync_gradients:
                self.after_update(update[0].item() / max(update[1].item(), 1), progress, lr)
                update = torch.zeros_like(update)
                if self.done():
                    return
        self.state.epoch += 1
        self.state.batch_in_epoch = 0

    def backward(self, batch, update):
        """Accumulate the gradient of a micro-batch's loss summed over its target tokens (divided by max_tokens, a
        constant that keeps its size that of a mean), and add the sum and the token count to `update`. The update's
        gradient is then rescaled by `scale_gradients` once every micro-batch of every process is in: the token-level
        mean over all of them, as one process would compute it on their union (each micro-batch and process weighs
        by its tokens; Trainer's `num_items_in_batch`)."""
        scale = self.config.max_tokens
        loss = training_loss(self.model, batch, self.config.label_smoothing, num_items=scale)
        # Accelerate divides each micro-batch's loss by gradient_accumulation_steps: undone, the sum is what counts
        self.accelerator.backward(loss * self.config.gradient_accumulation_steps)
        update += torch.stack([loss.detach().double() * scale, target_tokens(self.model, batch).double()])

    def scale_gradients(self, factor):
        """Multiply the accumulated gradients by `factor` (DistributedDataParallel has averaged them over the
        processes: the update's token-level mean is their mean times the processes over the update's tokens)."""
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(factor)

    def after_update(self, loss, progress, lr):
        """Bookkeeping after an update; `loss`: its training loss, the token-level mean over all its micro-batches
        and processes; `lr`: the learning rate it used."""
        s, c = self.state, self.config
        s.global_step += 1
        progress.update(1)
        if s.global_step % c.log_every == 0 or s.global_step == 1:
            record = {"step": s.global_step, "epoch": s.epoch, "loss": loss,
                      "lr": lr, "elapsed": round(s.elapsed_seconds, 1)}
            progress.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2e}")
            self.log(record)
        if c.eval_every and s.global_step % c.eval_every == 0:
            self.track_best(self.evaluate()["valid_loss"])
        if c.save_every and s.global_step % c.save_every == 0:
            self.save_checkpoint()

    def track_best(self, valid_loss):
        """Note a periodic validation loss: a new lowest one resets the early-stopping count."""
        s = self.state
        if valid_loss < s.best_valid_loss:
            s.best_valid_loss, s.best_step, s.evals_since_best = valid_loss, s.global_step, 0
        else:
            s.evals_since_best += 1

    def train(self):
        """Train until max_steps / max_epochs / max_minutes, or until the validation loss stops improving
        (config.patience); returns the evaluation record of the weights the model ends with: the last ones (averaged
        over the last checkpoints with average_last), or, for a run stopped by patience, its best checkpoint's where
        those validate lower."""
        if self.config.resume:
            self.resume()
        else:
            self.start_fresh()
        total = self.config.max_steps or None
        with tqdm(total=total, initial=self.state.global_step, disable=not self.accelerator.is_local_main_process,
                  desc="training") as progress:
            while not self.done():
                self.train_epoch(progress)
        # decided from the loop state, not from the folder: under `accelerate launch` another process may already
        # be writing step-N, and every process must take part in the same save
        c, step = self.config, self.state.global_step
        if not (c.save_every and step % c.save_every == 0 and step > 0):
            self.save_checkpoint(resume_point=True)
        final = self.evaluate_averaged() if self.config.average_last else self.evaluate()
        return self.best_if_lower(final) if self.stopped_early() else final

    def evaluate_averaged(self):
        """Load the mean of the last average_last checkpoints and evaluate it -> the record. The checkpoints are
        those an uninterrupted run keeps (`prune_checkpoints`): a resume point kept as the best checkpoint is not
        among them. Fewer than average_last (a run shorter than average_last * save_every) are averaged with a
        warning."""
        last = scheduled_checkpoints(self.output_dir)[-self.config.average_last :]
        if len(last) < self.config.average_last:
            warnings.warn(f"average_last={self.config.average_last}, but the run has {len(last)} checkpoint(s) to "
                          f"average (save_every={self.config.save_every}, {self.state.global_step} updates): the "
                          f"final weights average those", stacklevel=2)
        self.load_weights(average_checkpoints(last))
        return self.evaluate(averaged_checkpoints=len(last))  # not a point of the trajectory: marked as such

    def best_if_lower(self, final):
        """A run stopped by patience has trained past its best validation: its best checkpoint's weights replace the
        final ones (`final`, their evaluation record) when they validate lower -> the record of the weights kept."""
        best = self.best_checkpoint()
        if self.state.best_valid_loss >= final["valid_loss"]:
            return final
        if not best.exists():
            warnings.warn(f"update {self.state.best_step} validated lowest ({self.state.best_valid_loss:.4f} against "
                          f"{final['valid_loss']:.4f}) but has no checkpoint (save_every={self.config.save_every}, "
                          f"eval_every={self.config.eval_every}): the run ends with its last weights (averaged with "
                          f"average_last)", stacklevel=2)
            return final
        self.load_weights(load_file(str(best / "model.safetensors")))
        return self.evaluate(best_checkpoint=self.state.best_step)  # a trajectory point evaluated again: marked

    def load_weights(self, state):
        """Put a checkpoint's model weights (a state dict as saved, tied weights once) into the model."""
        self.accelerator.unwrap_model(self.model).load_state_dict(state, strict=False)

    def save_model(self, folder=None):
        """The final model with its tokenizer and generation settings, ready for from_pretrained/pipeline."""
        folder = Path(folder or self.output_dir / "model")
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            model = self.accelerator.unwrap_model(self.model)
            model.config.use_cache = True
            model.generation_config.num_beams = self.config.num_beams
            model.generation_config.max_new_tokens = self.config.max_new_tokens
            model.save_pretrained(folder)
            self.tokenizer.save_pretrained(folder)
        return folder
