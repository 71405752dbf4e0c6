"""The Accelerate training loop: exact resume, checkpoint averaging, schedules, gradient accumulation, metrics."""

import itertools
import json
import math
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import load_file

from talk_hf.training import loop
from talk_hf.training.corpora import load_tsv_pairs
from talk_hf.training.data import encode, train_tokenizer
from talk_hf.training.loop import (
    TrainConfig,
    Trainer,
    average_checkpoints,
    checkpoints,
    inverse_sqrt_schedule,
    make_collator,
    make_scheduler,
    source_gain,
    validation_loss,
)
from talk_hf.training.models import build_model, count_parameters
from talk_hf.training.run import final_weights

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "multi30k_pairs.tsv"
TINY = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_heads=2,
            decoder_heads=2, decoder_attention_heads=2, encoder_max_offsets=[2], decoder_max_offsets=[3],
            dropout=0.2, offset_dropout=0.1)


@pytest.fixture(scope="module")
def data():
    pairs = load_tsv_pairs(FIXTURE, 0, 1)
    tokenizer = train_tokenizer([pairs], vocab_size=200)
    return tokenizer, encode(pairs, tokenizer)


def run(data, output_dir, **overrides):
    tokenizer, dataset = data
    torch.manual_seed(0)
    model = build_model("talk", tokenizer, overrides=TINY)
    config = TrainConfig(output_dir=str(output_dir), max_tokens=256, learning_rate=3e-3, warmup_steps=2,
                         log_every=1, bleu_sentences=0, **overrides)
    trainer = Trainer(model, tokenizer, dataset, dataset.select(range(16)), config)
    trainer.train()
    return trainer


def losses(output_dir):
    records = [json.loads(line) for line in (Path(output_dir) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def test_resume_continues_exactly(data, tmp_path):
    """Stop after 3 updates, resume to 7: same losses and weights as 7 updates in one go (dropout on, epochs
    crossed, gradient accumulation on)."""
    straight = run(data, tmp_path / "a", max_steps=7, gradient_accumulation_steps=2)
    run(data, tmp_path / "b", max_steps=3, gradient_accumulation_steps=2)
    resumed = run(data, tmp_path / "b", max_steps=7, gradient_accumulation_steps=2, resume=True)
    assert straight.state.epoch >= 1, "the run should cross an epoch boundary"
    a, b = losses(tmp_path / "a"), losses(tmp_path / "b")
    assert set(a) == set(range(1, 8)) and all(a[s] == b[s] for s in a), (a, b)
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name


def test_the_training_clock_goes_on_across_a_resume(data, tmp_path, monkeypatch):
    """A resumed run's training time (train_run's train_minutes) includes the part before the resume. With a clock
    that ticks once per reading, the loop reads it once per micro-batch beyond each epoch's start, so the elapsed
    time counts micro-batches: 3 updates of 2, then 4 more."""
    ticks = itertools.count()
    monkeypatch.setattr(loop, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
    first = run(data, tmp_path, max_steps=3, gradient_accumulation_steps=2)
    resumed = run(data, tmp_path, max_steps=7, gradient_accumulation_steps=2, resume=True)
    assert (first.state.elapsed_seconds, resumed.state.elapsed_seconds) == (6, 14)


class Killed(Exception):
    """The process ends here."""


def test_a_run_killed_while_saving_resumes_from_its_last_whole_checkpoint(data, tmp_path, monkeypatch):
    """A process killed while writing step-N leaves no step-N: --resume continues from the checkpoint before it as
    if the run had stopped there, and clears what the killed save left."""
    run(data, tmp_path / "b", max_steps=2, save_every=2)

    def half_written(accelerator, folder):
        Path(folder).mkdir(parents=True)
        (Path(folder) / "model.safetensors").write_bytes(b"half")
        raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(Accelerator, "save_state", half_written)
        with pytest.raises(Killed):
            run(data, tmp_path / "b", max_steps=4, save_every=2, resume=True)
    assert [p.name for p in checkpoints(tmp_path / "b")] == ["step-2"]
    resumed = run(data, tmp_path / "b", max_steps=4, save_every=2, resume=True)
    assert not list((tmp_path / "b" / "checkpoints").glob("partial-*"))
    straight = run(data, tmp_path / "c", max_steps=4, save_every=2)
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name


def test_the_time_cap_is_judged_on_the_longest_training_time_of_all_processes(data, tmp_path, monkeypatch):
    """Processes read their own clocks; one past the cap before the others would leave them waiting for it."""
    trainer = run(data, tmp_path, max_steps=1)
    trainer.config.max_steps, trainer.config.max_minutes = 0, 1.0
    trainer.state.elapsed_seconds = 30.0
    assert not trainer.done()
    monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))
    monkeypatch.setattr(trainer.accelerator, "gather", lambda clock: torch.cat([clock, torch.tensor([75.0])]))
    assert trainer.done() and trainer.longest_training_time() == 75.0


def test_resume_without_checkpoint_fails_clearly(data, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        run(data, tmp_path, max_steps=1, resume=True)


def test_a_new_run_refuses_a_folder_that_holds_another(data, tmp_path):
    """Training afresh into an earlier run's folder would mix that run's checkpoints and metrics into its own."""
    run(data, tmp_path, max_steps=2, save_every=1)
    with pytest.raises(FileExistsError, match="holds an earlier run .* continue it with resume"):
        run(data, tmp_path, max_steps=3)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-1", "step-2"]  # left as they were


@pytest.mark.parametrize("changed", [dict(learning_rate=1e-2), dict(max_tokens=300), dict(seed=2)])
def test_a_resumed_run_keeps_its_settings(data, tmp_path, changed):
    """A checkpoint's scheduler would keep the old peak learning rate, a batch budget or seed would change the
    batches: resuming with other settings is refused by name; the limits may change (max_steps here)."""
    run(data, tmp_path, max_steps=2)
    name, value = next(iter(changed.items()))
    old = {"learning_rate": 3e-3, "max_tokens": 256, "seed": 1}[name]
    with pytest.raises(ValueError, match=rf"other settings or data {name} {old!r} \(now {value!r}\)"):
        tokenizer, dataset = data
        model = build_model("talk", tokenizer, overrides=TINY)
        settings = dict(dict(max_tokens=256, learning_rate=3e-3), **changed)
        config = TrainConfig(output_dir=str(tmp_path), warmup_steps=2, log_every=1, bleu_sentences=0, max_steps=4,
                             resume=True, **settings)
        Trainer(model, tokenizer, dataset, dataset.select(range(16)), config).train()
    assert run(data, tmp_path, max_steps=3, resume=True).state.global_step == 3


def test_a_cosine_schedule_keeps_its_length_on_resume(data, tmp_path):
    """The cosine decay spans max_steps: a resumed cosine run may not change it (inverse_sqrt runs may)."""
    run(data, tmp_path, max_steps=2, schedule="cosine")
    with pytest.raises(ValueError, match=r"max_steps 2 \(now 4\)"):
        run(data, tmp_path, max_steps=4, schedule="cosine", resume=True)


def test_other_training_data_is_refused_on_resume(data, tmp_path):
    tokenizer, dataset = data
    run(data, tmp_path, max_steps=2)
    config = TrainConfig(output_dir=str(tmp_path), max_tokens=256, learning_rate=3e-3, warmup_steps=2,
                         bleu_sentences=0, max_steps=3, resume=True)
    with pytest.raises(ValueError, match="train_examples"):
        Trainer(build_model("talk", tokenizer, overrides=TINY), tokenizer, dataset.select(range(40)),
                dataset.select(range(16)), config).train()


@pytest.mark.parametrize("training", [False, True])
def test_validation_runs_in_eval_mode_and_leaves_the_models_mode(data, training):
    tokenizer, dataset = data
    model = build_model("talk", tokenizer, overrides=dict(TINY, dropout=0.5)).train(training)
    collator = make_collator(model)
    losses = [validation_loss(model, dataset.select(range(8)), collator, 256) for _ in range(2)]
    assert model.training is training and losses[0] == losses[1]  # dropout off: the same loss twice


def test_every_training_step_runs_in_training_mode_after_validations_with_bleu(data, tmp_path, monkeypatch):
    """Validation (loss and BLEU, whose generate() needs eval mode) every 2 updates: the updates after it still
    train with dropout."""
    tokenizer, dataset = data
    model = build_model("talk", tokenizer, overrides=TINY)
    modes = []
    forward = type(model).forward
    monkeypatch.setattr(type(model), "forward", lambda self, *a, **k: (
        modes.append(self.training) if torch.is_grad_enabled() else None, forward(self, *a, **k))[1])
    config = TrainConfig(output_dir=str(tmp_path), max_tokens=256, max_steps=6, eval_every=2, bleu_sentences=4,
                         max_new_tokens=3)
    texts = (list(dataset["source"][:8]), list(dataset["target"][:8]))
    Trainer(model, tokenizer, dataset, dataset.select(range(8)), config, valid_texts=texts).train()
    assert len(modes) == 6 and all(modes), modes


def test_fp16_on_a_cpu_is_refused_not_run_in_fp32(data, tmp_path):
    """Accelerate autocasts fp16 only on accelerators: on a CPU the run would train in fp32 while its settings
    say fp16."""
    if torch.cuda.is_available():
        pytest.skip("fp16 runs on this machine's GPU")
    tokenizer, dataset = data
    config = TrainConfig(output_dir=str(tmp_path), max_tokens=256, max_steps=2, bleu_sentences=0,
                         mixed_precision="fp16")
    with pytest.raises(ValueError, match="mixed_precision=.fp16. does not run on a CPU"):
        Trainer(build_model("talk", tokenizer, overrides=TINY), tokenizer, dataset, dataset, config)


def test_empty_sets_and_validation_examples_past_the_batch_budget_are_refused(data, tmp_path):
    tokenizer, dataset = data
    config = TrainConfig(output_dir=str(tmp_path), max_tokens=256, max_steps=2, bleu_sentences=0)
    model = build_model("talk", tokenizer, overrides=TINY)
    with pytest.raises(ValueError, match="the training set is empty"):
        Trainer(model, tokenizer, dataset.select([]), dataset, config)
    with pytest.raises(ValueError, match="the validation set is empty"):
        Trainer(model, tokenizer, dataset, dataset.select([]), config)
    longest = max(dataset["num_tokens"])
    small = TrainConfig(output_dir=str(tmp_path), max_tokens=longest - 1, max_steps=2, bleu_sentences=0)
    short = dataset.filter(lambda n: n < longest, input_columns="num_tokens")
    with pytest.raises(ValueError, match=f"a validation example has {longest} tokens, more than max_tokens"):
        Trainer(model, tokenizer, short, dataset, small)


def test_examples_and_generations_past_a_baselines_positions_are_refused(data, tmp_path):
    """transformers' baselines have fixed-size position tables (Marian/BART max_position_embeddings, GPT-2
    n_positions): a source, target or block longer than the table, or a validation generation that could outgrow
    it, is refused before training, not an IndexError mid-run (or after it, at the final validation)."""
    tokenizer, _ = data

    def pairs(source, target):
        return datasets.Dataset.from_dict({"input_ids": [[5] * source, [5] * 3], "labels": [[6] * target, [6] * 3],
                                           "num_tokens": [max(source, target), 3]})

    config = TrainConfig(output_dir=str(tmp_path), max_tokens=256, max_steps=2, max_new_tokens=4)
    small = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32,
                 encoder_attention_heads=2, decoder_attention_heads=2, max_position_embeddings=6)
    marian = build_model("marian", tokenizer, overrides=small)
    for train, valid, message in ((pairs(7, 2), pairs(3, 3), "a training example has 7 source tokens"),
                                  (pairs(3, 3), pairs(2, 9), "a validation example has 9 target tokens")):
        with pytest.raises(ValueError, match=f"^{message}, more than the model's 6 positions"):
            Trainer(marian, tokenizer, train, valid, config)
    fits = pairs(6, 6)
    Trainer(marian, tokenizer, fits, fits, config)  # everything fits: accepted
    generating = TrainConfig(output_dir=str(tmp_path), max_tokens=256, max_steps=2, max_new_tokens=7)
    with pytest.raises(ValueError, match="^max_new_tokens=7 can outgrow the model's 6 decoder positions"):
        Trainer(marian, tokenizer, fits, fits, generating)
    blocks = datasets.Dataset.from_dict({"input_ids": [[5] * 8] * 2, "labels": [[5] * 8] * 2, "num_tokens": [8] * 2})
    gpt2 = build_model("gpt2", tokenizer, overrides=dict(d_model=16, decoder_layers=1, decoder_attention_heads=2,
                                                         decoder_ffn_dim=32, max_position_embeddings=7))
    with pytest.raises(ValueError, match="^a training example has 8 tokens, more than the model's 7 positions"):
        Trainer(gpt2, tokenizer, blocks, blocks, config)


def test_averaging_keeps_equal_tensors_and_refuses_what_has_no_mean(tmp_path):
    """Three checkpoints: a weight equal in all comes back bit-equal (a fixed random projection; fp32 sums of three
    equal values do not always divide back), integers are copied when equal and refused when not, a tensor of
    another shape or dtype is refused by name."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    fixed, ids = torch.randn(1000), torch.tensor([1, 2 ** 40 + 1])
    paths = []
    for i, scale in enumerate((1.0, 2.0, 4.0)):
        paths.append(tmp_path / f"step-{i}")
        paths[-1].mkdir()
        save_file({"fixed": fixed, "w": torch.full((3,), scale, dtype=torch.bfloat16), "ids": ids},
                  str(paths[-1] / "model.safetensors"))
    averaged = average_checkpoints(paths)
    assert torch.equal(averaged["fixed"], fixed) and torch.equal(averaged["ids"], ids)
    assert averaged["w"].dtype == torch.bfloat16 and torch.equal(averaged["w"], torch.full((3,), 7 / 3).bfloat16())
    for name, value, message in [
        ("ids", torch.tensor([1, 3]), r"ids is torch.int64, which has no mean, and .*step-2"),
        ("w", torch.ones(3, 1, dtype=torch.bfloat16), r"step-2: w is \(3, 1\) torch.bfloat16, but \(3,\)"),
        ("w", torch.ones(3), r"step-2: w is \(3,\) torch.float32, but \(3,\) torch.bfloat16"),
    ]:
        state = load_file(str(paths[2] / "model.safetensors"))
        save_file({**state, name: value}, str(paths[2] / "model.safetensors"))
        with pytest.raises(ValueError, match=message):
            average_checkpoints(paths)
        save_file(state, str(paths[2] / "model.safetensors"))


def test_checkpoints_are_kept_and_averaged(data, tmp_path):
    trainer = run(data, tmp_path, max_steps=6, save_every=2, keep_checkpoints=2, average_last=2)
    found = checkpoints(tmp_path)
    assert [p.name for p in found] == ["step-4", "step-6"]
    states = [load_file(str(p / "model.safetensors")) for p in found]
    averaged = average_checkpoints(found)
    key = next(k for k in averaged if k.endswith("linear1.weight"))
    torch.testing.assert_close(averaged[key], (states[0][key] + states[1][key]) / 2)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert torch.equal(model.state_dict()[key], averaged[key])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "valid_loss" in records[-1] and math.isfinite(records[-1]["valid_loss"])
    assert records[-1]["averaged_checkpoints"] == 2  # the averaged weights' evaluation, marked: no trajectory point
    assert ["averaged_checkpoints" in r for r in records].count(True) == 1


@pytest.mark.parametrize("averaged_loss, kept", [(2.4, "best"), (0.5, "averaged")])
def test_a_run_stopped_by_patience_ends_with_the_lower_validating_weights(data, tmp_path, monkeypatch,
                                                                          averaged_loss, kept):
    """Validation losses 3, 1 (the best, update 4), 2, 2.5, 2.6: patience 3 stops the run at update 10. Its best
    checkpoint is kept beside the last 3; the model ends with the best checkpoint's weights when the last 3 averaged
    validate higher, with the average when it validates lower."""
    scripted_validation(monkeypatch, [3.0, 1.0, 2.0, 2.5, 2.6, averaged_loss, 1.0])
    trainer = run(data, tmp_path, max_steps=20, eval_every=2, save_every=2, patience=3, keep_checkpoints=3,
                  average_last=3)
    found = checkpoints(tmp_path)
    assert trainer.stopped_early() and [p.name for p in found] == ["step-4", "step-6", "step-8", "step-10"]
    expected = load_file(str(found[0] / "model.safetensors")) if kept == "best" else average_checkpoints(found[1:])
    model = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    for key, value in expected.items():
        assert torch.equal(model[key], value), key
    final = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert final.get("best_checkpoint") == (4 if kept == "best" else None)
    assert final_weights(final) == ("update 4" if kept == "best" else "last 3 averaged")


def test_a_best_validation_without_its_checkpoint_is_said_and_the_run_keeps_its_weights(data, tmp_path,
                                                                                        monkeypatch):
    """The same validations, checkpoints every 3 updates: update 4, the best, was never saved, so the run ends with
    its last 3 checkpoints averaged and a warning says why."""
    scripted_validation(monkeypatch, [3.0, 1.0, 2.0, 2.5, 2.6, 2.4])
    with pytest.warns(UserWarning, match=r"update 4 validated lowest \(1.0000 against 2.4000\) but has no checkpoint"):
        trainer = run(data, tmp_path, max_steps=20, eval_every=2, save_every=3, patience=3, keep_checkpoints=3,
                      average_last=3)
    found = checkpoints(tmp_path)
    assert trainer.stopped_early() and [p.name for p in found] == ["step-6", "step-9", "step-10"]
    model = trainer.accelerator.unwrap_model(trainer.model).state_dict()
    for key, value in average_checkpoints(found).items():
        assert torch.equal(model[key], value), key
    final = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    assert final_weights(final) == "last 3 averaged"


def copy_task(eos, rows, seed=0):
    """Sources of 6 random tokens and </s>; each target is its source."""
    generator = torch.Generator().manual_seed(seed)
    sequences = [torch.randint(10, 40, (6,), generator=generator).tolist() + [eos] for _ in range(rows)]
    return datasets.Dataset.from_list([{"input_ids": s, "labels": s, "num_tokens": len(s)} for s in sequences])


def test_source_gain_tells_a_model_that_reads_its_source_from_one_that_does_not(data, tmp_path):
    """On a copy task the logged gain grows from about 0 to over half a nat; with the encoder's last LayerNorm weight
    zeroed (post-norm: the encoder outputs its bias at every position, whatever the input) the gain is 0, while
    the validation loss alone says nothing of it."""
    tokenizer, _ = data
    task = copy_task(tokenizer.eos_token_id, 256)
    torch.manual_seed(0)
    model = build_model("talk", tokenizer, overrides=dict(TINY, dropout=0.0, offset_dropout=0.0))
    config = TrainConfig(output_dir=str(tmp_path), max_tokens=256, learning_rate=3e-3, warmup_steps=10,
                         schedule="cosine", bleu_sentences=0, max_steps=200, eval_every=50)
    trainer = Trainer(model, tokenizer, task, task.select(range(32)), config)
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    gains = [r["valid_source_gain"] for r in records if "valid_source_gain" in r]
    assert len(gains) == 5 and gains[0] < 0.1 < 0.5 < gains[3], gains
    model, collator = trainer.accelerator.unwrap_model(trainer.model), trainer.collator
    assert source_gain(model, task.select(range(32)), collator, 256)[0] == pytest.approx(gains[-1])
    with torch.no_grad():
        model.model.encoder.layers[-1].final_layer_norm.weight.zero_()
    gain, tokens = source_gain(model, task.select(range(32)), collator, 256)
    assert abs(gain) < 1e-5 and tokens == 32 * 7
    assert source_gain(model, task.select([0]), collator, 256) == (0.0, 0)  # a lone row has no other source


def test_save_model_writes_a_loadable_folder(data, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, pipeline

    trainer = run(data, tmp_path, max_steps=2)
    folder = trainer.save_model()
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    assert model.generation_config.num_beams == 4
    out = pipeline("translation", model=str(folder))("Ein Hund.", max_new_tokens=3)
    assert set(out[0]) == {"translation_text"}


def test_inverse_sqrt_schedule_matches_fairseq():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    sched = inverse_sqrt_schedule(opt, warmup_steps=4, warmup_init_lr=1e-7)
    lrs = []
    for _ in range(16):
        lrs.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    assert lrs[0] == pytest.approx(1e-7 + (1e-3 - 1e-7) / 4)
    assert max(lrs) == pytest.approx(1e-3)
    assert lrs[15] == pytest.approx(1e-3 * math.sqrt(4 / 16))


def test_cosine_schedule_needs_steps_and_decays():
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    with pytest.raises(ValueError, match="max_steps"):
        make_scheduler(opt, TrainConfig(output_dir="x", max_epochs=1, schedule="cosine", warmup_steps=2), 0)
    sched = make_scheduler(opt, TrainConfig(output_dir="x", max_steps=10, schedule="cosine", warmup_steps=2), 10)
    lrs = []
    for _ in range(10):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr()[0])
    assert lrs[1] == pytest.approx(1.0) and lrs[-1] < 0.05


def scripted_validation(monkeypatch, losses):
    """Trainer.evaluate returns the next of `losses` (and logs it), so the early-stopping decisions are known."""
    queue = iter(losses)

    def evaluate(self, **fields):
        record = {"step": self.state.global_step, "valid_loss": next(queue), **fields}
        self.log(record)
        return record

    monkeypatch.setattr(Trainer, "evaluate", evaluate)


def test_training_stops_when_the_validation_loss_stops_improving(data, tmp_path, monkeypatch):
    """patience=2: the loss is lowest at update 2 (2.0), then 2.5 and 2.0 (not lower): training stops at update 4."""
    scripted_validation(monkeypatch, [3.0, 2.0, 2.5, 2.0, 1.0, 0.5])
    trainer = run(data, tmp_path, max_steps=10, eval_every=1, save_every=1, keep_checkpoints=2, patience=2)
    s = trainer.state
    assert (s.global_step, s.best_step, s.best_valid_loss, s.evals_since_best) == (4, 2, 2.0, 2)
    assert trainer.stopped_early()
    assert [p.name for p in checkpoints(tmp_path)] == ["step-2", "step-3", "step-4"]  # the best one kept too


def test_early_stopping_state_survives_a_resume(data, tmp_path, monkeypatch):
    """Stopped by max_steps after one evaluation without improvement, the resumed run needs only one more."""
    scripted_validation(monkeypatch, [2.0, 1.0, 1.5, 9.0])
    run(data, tmp_path, max_steps=3, eval_every=1, save_every=1, patience=2)  # evaluations at 1, 2, 3, then final
    scripted_validation(monkeypatch, [1.2, 1.1, 9.0])
    trainer = run(data, tmp_path, max_steps=10, eval_every=1, save_every=1, patience=2, resume=True)
    assert (trainer.state.global_step, trainer.state.best_step, trainer.state.best_valid_loss) == (4, 2, 1.0)


def test_without_patience_training_runs_to_its_budget(data, tmp_path, monkeypatch):
    scripted_validation(monkeypatch, [1.0, 2.0, 3.0, 4.0, 5.0])
    trainer = run(data, tmp_path, max_steps=4, eval_every=1, save_every=1, keep_checkpoints=2)
    assert trainer.state.global_step == 4 and not trainer.stopped_early()
    assert [p.name for p in checkpoints(tmp_path)] == ["step-3", "step-4"]  # no patience: the best is not kept


@pytest.mark.parametrize("bad,match", [(dict(schedule="linear"), "schedule"), (dict(max_steps=0), "at least one"),
                                       (dict(average_last=9, keep_checkpoints=2), "keep_checkpoints"),
                                       (dict(patience=2), "eval_every > 0"),
                                       (dict(patience=-1, eval_every=5), "patience >= 0"),
                                       (dict(keep_checkpoints=0), "keep_checkpoints must be >= 1"),
                                       (dict(average_last=-1), "average_last >= 0")])
def test_config_errors(bad, match):
    kwargs = {"output_dir": "x", "max_steps": 1, **bad}
    with pytest.raises(ValueError, match=match):
        TrainConfig(**kwargs)


SEQ2SEQ_SIZE = dict(d_model=32, encoder_layers=1, decoder_layers=1, decoder_attention_heads=2)
SIZES = {"marian": dict(SEQ2SEQ_SIZE, encoder_attention_heads=2), "bart": dict(SEQ2SEQ_SIZE, encoder_attention_heads=2),
         "gpt2": dict(d_model=32, decoder_layers=1, decoder_attention_heads=2), "lightconv": SEQ2SEQ_SIZE,
         "rfa_doc": dict(SEQ2SEQ_SIZE, encoder_attention_heads=2), "talk_lm": dict(d_model=32, decoder_layers=1)}


@pytest.mark.parametrize("kind", list(SIZES))
def test_baselines_and_families_build_at_a_given_size(kind, data):
    tokenizer, _ = data
    model = build_model(kind, tokenizer, overrides=SIZES[kind])
    assert model.config.vocab_size == len(tokenizer) and count_parameters(model) > 0
    assert model.get_input_embeddings().weight.shape[1] == 32
    if model.config.is_encoder_decoder:
        assert model.config.decoder_start_token_id == tokenizer.eos_token_id


LM_TINY = dict(d_model=16, decoder_layers=1, decoder_ffn_dim=32, decoder_heads=2, decoder_max_offsets=[3],
               dropout=0.0, offset_dropout=0.0)


def lm_batch(tokenizer):
    from talk_hf.training.loop import lm_collate

    sentences = ["a man rides a bike .", "two dogs play in the snow ."]
    examples = [{"input_ids": ids, "labels": ids} for ids in tokenizer(sentences)["input_ids"]]
    return lm_collate(examples, tokenizer.pad_token_id)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_an_lm_trains_on_its_own_loss_with_its_config_label_smoothing(data, smoothing):
    """The talk_hf causal LMs carry label smoothing in their config and the trainer minimises their own loss, so
    the config's value is the one applied (the next-token cross-entropy, smoothed by that amount)."""
    from talk_hf.training.loop import token_loss, training_loss

    tokenizer, _ = data
    model = build_model("talk_lm", tokenizer, overrides=dict(LM_TINY, label_smoothing=smoothing))
    batch = lm_batch(tokenizer)
    loss = training_loss(model, batch, label_smoothing=0.0)
    torch.testing.assert_close(loss, token_loss(model, batch, smoothing))
    assert (smoothing == 0.0) == torch.allclose(loss, token_loss(model, batch, 0.0))


def test_label_smoothing_set_in_two_places_is_refused(data, tmp_path):
    tokenizer, dataset = data
    model = build_model("talk_lm", tokenizer, overrides=dict(LM_TINY, label_smoothing=0.1))
    config = TrainConfig(output_dir=str(tmp_path), max_steps=1, label_smoothing=0.1)
    with pytest.raises(ValueError, match="config's label_smoothing .0.1.; set it there"):
        Trainer(model, tokenizer, dataset, dataset, config)


def test_a_model_starts_from_another_runs_weights(data, tmp_path):
    """initialise_from: every weight the folder holds is copied (tied ones through their one stored copy), the
    names of those it lacks come back, and a folder of another architecture is refused."""
    from talk_hf.training.run import initialise_from

    tokenizer, _ = data
    tiny = dict(d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32,
                encoder_attention_heads=2, decoder_attention_heads=2, causal_num_frequencies=4,
                cross_num_frequencies=4)
    sentence = build_model("rfa_doc", tokenizer, overrides=dict(tiny, sentential_gate="none"))
    sentence.save_pretrained(tmp_path / "sentence")
    gated = build_model("rfa_doc", tokenizer, overrides=dict(tiny, sentential_gate="decay"))
    assert initialise_from(gated, tmp_path / "sentence") == ["model.decoder.layers.0.mixer.gate.bias",
                                                              "model.decoder.layers.0.mixer.gate.weight"]
    ours = gated.state_dict()
    assert all(torch.equal(value, ours[name]) for name, value in sentence.state_dict().items())
    assert gated.lm_head.weight.data_ptr() == gated.get_input_embeddings().weight.data_ptr()  # still tied
    with pytest.raises(ValueError, match="weights the model lacks"):
        initialise_from(build_model("talk", tokenizer, overrides=TINY), tmp_path / "sentence")
    with pytest.raises(ValueError, match="no model.*safetensors"):
        initialise_from(gated, tmp_path)


def test_checkpoints_and_validations_leave_the_training_trajectory_unchanged(data, tmp_path):
    """A run that saves and validates after every update ends with the same weights as one that does neither (the
    saved RNG states are read, not drawn from): a grid point's final weights do not depend on its checkpoints."""
    quiet = run(data, tmp_path / "quiet", max_steps=4)
    busy = run(data, tmp_path / "busy", max_steps=4, save_every=1, eval_every=1, keep_checkpoints=4)
    assert len(checkpoints(tmp_path / "busy")) == 4
    for (name, p), q in zip(quiet.model.named_parameters(), busy.model.parameters()):
        assert torch.equal(p, q), name


def update_gradients(trainer, monkeypatch):
    """Record, at every optimizer update, the weights it starts from and the accumulated gradients it applies."""
    seen = []
    inner = trainer.optimizer.optimizer
    original = inner.step

    def step(*args, **kwargs):
        model = trainer.accelerator.unwrap_model(trainer.model)
        seen.append(({n: p.detach().clone() for n, p in model.named_parameters()},
                     {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        return original(*args, **kwargs)

    monkeypatch.setattr(inner, "step", step)
    return seen


@pytest.mark.parametrize("which", ["first", "epoch's last"])
def test_an_update_is_the_token_level_mean_over_its_micro_batches(data, tmp_path, monkeypatch, which):
    """With gradient accumulation an update's gradient is that of the mean loss over every target token of its
    micro-batches, as one batch of their union would give it: a micro-batch weighs by its tokens, and the epoch's
    last update, short of micro-batches, is not scaled down. The logged loss is that mean."""
    tokenizer, dataset = data
    batches = loop.TokenBatchSampler(dataset["num_tokens"], 256, shuffle=True, seed=1).batches(0)
    accumulation = next(n for n in (2, 3, 4, 5) if len(batches) % n)  # the epoch ends with a short update
    groups = [batches[i : i + accumulation] for i in range(0, len(batches), accumulation)]
    update = 1 if which == "first" else len(groups)
    no_dropout = dict(TINY, dropout=0.0, offset_dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    model = build_model("talk", tokenizer, overrides=no_dropout)
    config = TrainConfig(output_dir=str(tmp_path), max_tokens=256, learning_rate=3e-3, warmup_steps=2, log_every=1,
                         bleu_sentences=0, max_steps=update, gradient_accumulation_steps=accumulation)
    trainer = Trainer(model, tokenizer, dataset, dataset.select(range(16)), config)
    seen = update_gradients(trainer, monkeypatch)
    trainer.train()
    weights, gradients = seen[update - 1]
    reference = build_model("talk", tokenizer, overrides=no_dropout)
    reference.load_state_dict(weights, strict=False)
    reference.train()
    collate = loop.make_collator(reference)
    batches = [collate([dataset[i] for i in batch]) for batch in groups[update - 1]]
    tokens = sum(int((b["labels"] != -100).sum()) for b in batches)
    loss = sum(loop.token_loss(reference, b, reduction="sum") for b in batches) / tokens
    loss.backward()
    for name, p in reference.named_parameters():
        torch.testing.assert_close(gradients[name], p.grad, rtol=1e-4, atol=1e-7, msg=name)
    assert losses(tmp_path)[update] == pytest.approx(loss.item(), rel=1e-5)


def test_a_resumed_run_keeps_and_averages_the_checkpoints_of_an_uninterrupted_one(data, tmp_path):
    """A run stopped off the save_every schedule (update 5 of save_every 2) saves a checkpoint to resume from; once
    the resumed run saves a later one it is removed, so the last checkpoints averaged are an uninterrupted run's."""
    settings = dict(save_every=2, keep_checkpoints=3, average_last=3)
    straight = run(data, tmp_path / "a", max_steps=6, **settings)
    run(data, tmp_path / "b", max_steps=5, **settings)
    assert [p.name for p in checkpoints(tmp_path / "b")] == ["step-2", "step-4", "step-5"]
    resumed = run(data, tmp_path / "b", max_steps=6, resume=True, **settings)
    assert [p.name for p in checkpoints(tmp_path / "b")] == ["step-2", "step-4", "step-6"]
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name


def test_a_changed_save_every_keeps_the_checkpoints_of_the_first_schedule(data, tmp_path):
    """Checkpointing options may change on resume: the checkpoints of the first schedule stay, pruned by
    keep_checkpoints, and only the point where the first run stopped (off its schedule) goes."""
    run(data, tmp_path, max_steps=5, save_every=2, keep_checkpoints=4)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-2", "step-4", "step-5"]
    run(data, tmp_path, max_steps=6, save_every=3, keep_checkpoints=4, resume=True)
    assert [p.name for p in checkpoints(tmp_path)] == ["step-2", "step-4", "step-6"]


def test_a_checkpoint_whose_schedule_ran_ahead_of_its_updates_is_refused(data, tmp_path):
    """A checkpoint of a loop that stepped the schedule once per process per update cannot be continued."""
    trainer = run(data, tmp_path, max_steps=2)
    folder = checkpoints(tmp_path)[-1]
    trainer.scheduler.scheduler.last_epoch = 4  # the schedule of 2 processes after 2 updates
    trainer.accelerator.save_state(str(folder))
    with pytest.raises(ValueError, match="schedule is at step 4 after 2 updates"):
        run(data, tmp_path, max_steps=3, resume=True)
