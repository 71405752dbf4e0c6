"""The models where transformers users reach for them: remote code without the package, pipelines, tokenizer
packaging, Seq2SeqTrainer and Trainer on real Multi30k pairs."""

import copy
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from datasets import Dataset
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForLanguageModeling,
    DataCollatorForSeq2Seq,
    GenerationConfig,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainingArguments,
    pipeline,
)

from talk_hf import train_joint_bpe
from tests.models.tiny import ALL, LM, make

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "multi30k_pairs.tsv"


def pairs():
    return [line.rstrip("\n").split("\t") for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def tokenizer():
    return train_joint_bpe([text for pair in pairs() for text in pair], vocab_size=300)


@pytest.fixture(scope="module")
def lm_tokenizer():
    return train_joint_bpe([text for pair in pairs() for text in pair], vocab_size=300, add_eos=False)


def sized(name, tok):
    return make(name, vocab_size=len(tok))


def run_isolated(code, cwd):
    """Run Python in a fresh process where `import talk_hf` fails (as for a user without the package)."""
    prelude = "import sys\nsys.modules['talk_hf'] = None\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(cwd / "hf_home")}
    result = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                            cwd=cwd, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


# --- remote code --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc"])
def test_seq2seq_remote_code_without_the_package(name, tokenizer, tmp_path):
    model = sized(name, tokenizer)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert {"talk_conv.py", "dynamic_conv.py", "rfa.py"} & {p.name for p in folder.iterdir()}
    text = "Zwei junge Männer spielen Fußball."
    expected = model.generate(**tokenizer([text], return_tensors="pt"), num_beams=2, max_new_tokens=6, min_new_tokens=6)
    out = run_isolated(
        f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
        tok = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        ids = model.generate(**tok([{text!r}], return_tensors="pt"), num_beams=2, max_new_tokens=6, min_new_tokens=6)
        print(ids.tolist())
        translator = pipeline("translation", model={str(folder)!r}, trust_remote_code=True)
        print(translator({text!r}, max_new_tokens=4, min_new_tokens=4))
        from transformers import AutoModel
        print(type(AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)).__name__)
        """,
        tmp_path,
    )
    lines = out.strip().splitlines()
    assert lines[0] == str(expected.tolist())
    assert "translation_text" in lines[1]
    assert lines[2] == type(model.model).__name__  # the base model, as AutoModel loads transformers' own


def test_lm_remote_code_without_the_package(lm_tokenizer, tmp_path):
    model = sized("talk_lm", lm_tokenizer)
    folder = tmp_path / "lm"
    model.save_pretrained(folder)
    lm_tokenizer.save_pretrained(folder)
    prompt = lm_tokenizer(["Ein Hund"], return_tensors="pt")
    expected = model.generate(**prompt, max_new_tokens=5, min_new_tokens=5)
    out = run_isolated(
        f"""
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        model = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
        tok = AutoTokenizer.from_pretrained({str(folder)!r}, trust_remote_code=True)
        print(model.generate(**tok(["Ein Hund"], return_tensors="pt"), max_new_tokens=5, min_new_tokens=5).tolist())
        print(type(model).__name__ in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())  # Trainer's smoother shifts it
        """,
        tmp_path,
    )
    assert out.splitlines() == [str(expected.tolist()), "True"]


def test_remote_code_of_two_folders_in_one_process(tokenizer, lm_tokenizer, tmp_path):
    """Each folder brings its own copy of the code, and the cache classes build the layer class registered last:
    a model loaded first still generates once another folder's model is loaded, and streaming document translation
    takes a model whose classes come from such a copy."""
    from talk_hf import translate_document_streaming

    seq2seq, lm = sized("talk", tokenizer), sized("talk_lm", lm_tokenizer)
    for model, tok, name in ((seq2seq, tokenizer, "seq2seq"), (lm, lm_tokenizer, "lm")):
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    source = tokenizer(["Zwei junge Männer spielen Fußball."], return_tensors="pt")
    expected = seq2seq.generate(**source, max_new_tokens=4, min_new_tokens=4)
    document = ["Ein Hund rennt.", "Er bellt."]
    streamed = translate_document_streaming(seq2seq, tokenizer, document, window=2, max_new_tokens=3)
    out = run_isolated(
        f"""
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
        seq2seq = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "seq2seq")!r}, trust_remote_code=True)
        AutoModelForCausalLM.from_pretrained({str(tmp_path / "lm")!r}, trust_remote_code=True)
        tok = AutoTokenizer.from_pretrained({str(tmp_path / "seq2seq")!r}, trust_remote_code=True)
        source = tok(["Zwei junge Männer spielen Fußball."], return_tensors="pt")
        print(seq2seq.generate(**source, max_new_tokens=4, min_new_tokens=4).tolist())
        translator = pipeline("document-translation", model={str(tmp_path / "seq2seq")!r}, trust_remote_code=True)
        print(translator({document!r}, window=2, streaming=True, max_new_tokens=3)["translations"])
        """,
        tmp_path,
    )
    assert out.strip().splitlines() == [str(expected.tolist()), str(streamed)]


def test_remote_code_uses_kernels_when_the_package_is_installed(tokenizer, tmp_path):
    """Without talk_hf imported, remote code still finds the compiled extension if the package is installed."""
    folder = tmp_path / "model"
    sized("talk", tokenizer).save_pretrained(folder)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home")}
    code = f"""
    import torch
    from transformers import AutoModelForSeq2SeqLM
    model = AutoModelForSeq2SeqLM.from_pretrained({str(folder)!r}, trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules")
    with torch.profiler.profile() as prof:
        model(input_ids=torch.tensor([[5, 6, 7]]), decoder_input_ids=torch.tensor([[2, 5]]))
    print(any(e.name == "talk_hf::talk_conv_fwd" for e in prof.events()))
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "True"


# --- pipelines -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["talk", "lightconv", "rfa_doc"])
def test_translation_and_summarization_pipelines(name, tokenizer, tmp_path):
    model = sized(name, tokenizer)
    translator = pipeline("translation", model=model, tokenizer=tokenizer)
    one = translator("Ein Mann fährt Fahrrad.", max_new_tokens=5, min_new_tokens=5)
    ids = model.generate(**tokenizer(["Ein Mann fährt Fahrrad."], return_tensors="pt"), max_new_tokens=5,
                         min_new_tokens=5)
    assert one == [{"translation_text": tokenizer.decode(ids[0], skip_special_tokens=True).strip()}]
    many = translator(["Ein Hund.", "Zwei Katzen."], num_beams=2, max_new_tokens=4)
    assert len(many) == 2 and all(set(r) == {"translation_text"} for r in many)
    two = translator("Ein Hund.", num_beams=3, num_return_sequences=2, max_new_tokens=4)
    assert len(two) == 2
    # batched, each input keeps its own hypotheses; max_length limits the translation, not the source
    texts, beams = ["Ein Hund.", "Zwei Katzen spielen."], dict(num_beams=3, num_return_sequences=2, max_new_tokens=4)
    assert translator(texts, batch_size=2, **beams) == [translator(t, **beams) for t in texts]
    ids = model.generate(**tokenizer(["Ein Mann fährt Fahrrad."], return_tensors="pt"), max_length=3, num_beams=1)
    assert translator("Ein Mann fährt Fahrrad.", max_length=3, num_beams=1) == [
        {"translation_text": tokenizer.decode(ids[0], skip_special_tokens=True).strip()}]
    summary = pipeline("summarization", model=model, tokenizer=tokenizer)("Ein Hund läuft.", max_new_tokens=3)
    assert set(summary[0]) == {"summary_text"}
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    for trust in (False, True):  # the installed package's classes, or the folder's own code
        from_path = pipeline("translation", model=str(tmp_path), trust_remote_code=trust)
        assert from_path("Ein Mann fährt Fahrrad.", max_new_tokens=5, min_new_tokens=5) == one


@pytest.mark.parametrize("name", list(LM))
def test_text_generation_pipeline(name, lm_tokenizer):
    model = sized(name, lm_tokenizer)
    generator = pipeline("text-generation", model=model, tokenizer=lm_tokenizer)
    out = generator(["Ein Hund", "Zwei junge Männer spielen"], max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert len(out) == 2 and out[0][0]["generated_text"].startswith("Ein Hund")


# --- tokenizer packaging --------------------------------------------------------------------------------------------


def test_tokenizer_round_trip_with_text_target_and_separator(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    src, tgt = pairs()[0]
    batch = loaded([src], text_target=[tgt])
    assert batch["labels"][0][-1] == loaded.eos_token_id and batch["input_ids"] == tokenizer([src])["input_ids"]
    window = loaded("Ein Hund. <sep> Eine Katze.")["input_ids"]
    assert window.count(loaded.convert_tokens_to_ids("<sep>")) == 1
    assert loaded.convert_tokens_to_ids("<sep>") == ALL["rfa_doc"][3]["sep_token_id"]


# --- training --------------------------------------------------------------------------------------------------------


def _translation_dataset(tokenizer):
    src, tgt = zip(*pairs())
    ds = Dataset.from_dict({"de": list(src), "en": list(tgt)})
    return ds.map(lambda b: tokenizer(b["de"], text_target=b["en"], max_length=64, truncation=True),
                  batched=True, remove_columns=["de", "en"])


def _bleu_metric(tokenizer):
    def compute_metrics(prediction):
        preds, labels = prediction.predictions, prediction.label_ids
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        hyps = tokenizer.batch_decode(preds, skip_special_tokens=True)
        refs = tokenizer.batch_decode(labels, skip_special_tokens=True)
        return {"bleu": sacrebleu.corpus_bleu(hyps, [refs]).score}

    return compute_metrics


@pytest.mark.parametrize("name", ["talk", "dynamic_conv", "rfa_doc"])
def test_seq2seq_trainer_fine_tunes_and_reloads(name, tokenizer, tmp_path):
    model = sized(name, tokenizer)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, max_new_tokens=8,
    )
    ds = _translation_dataset(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, per_device_eval_batch_size=16,
        gradient_accumulation_steps=2, max_steps=2, learning_rate=1e-3, label_smoothing_factor=0.1,
        predict_with_generate=True, generation_num_beams=2, generation_max_length=10, report_to="none",
        use_cpu=True, save_strategy="steps", save_steps=2, logging_steps=1, eval_strategy="no",
    )
    trainer = Seq2SeqTrainer(
        model=model, args=args, train_dataset=ds, eval_dataset=ds.select(range(16)), processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=_bleu_metric(tokenizer),
    )
    result = trainer.train()
    assert result.global_step == 2 and np.isfinite(result.training_loss)
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    metrics = trainer.evaluate()
    assert "eval_bleu" in metrics and 0.0 <= metrics["eval_bleu"] <= 100.0
    checkpoint = tmp_path / "run" / "checkpoint-2"
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    for key, value in model.state_dict().items():
        assert torch.equal(value, reloaded.state_dict()[key]), key


@pytest.mark.parametrize("name", list(LM))
def test_trainer_trains_a_causal_lm_and_reloads(name, lm_tokenizer, tmp_path):
    model = sized(name, lm_tokenizer)
    texts = [text for pair in pairs() for text in pair]
    ds = Dataset.from_dict({"text": texts}).map(lambda b: lm_tokenizer(b["text"]), batched=True,
                                                remove_columns=["text"])
    args = TrainingArguments(output_dir=str(tmp_path / "run"), per_device_train_batch_size=8, max_steps=2,
                             gradient_accumulation_steps=2, learning_rate=1e-3, report_to="none", use_cpu=True,
                             save_strategy="steps", save_steps=2, logging_steps=1)
    collator = DataCollatorForLanguageModeling(lm_tokenizer, mlm=False)
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collator, processing_class=lm_tokenizer)
    result = trainer.train()
    assert result.global_step == 2 and np.isfinite(result.training_loss)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-2")
    for key, value in model.state_dict().items():
        assert torch.equal(value, reloaded.state_dict()[key]), key



def _one_sgd_step(model, dataset, collator, batch, accumulation, tmp_path, **settings):
    """The parameters after one Trainer update of plain SGD (lr 1, no clipping) over `batch` x `accumulation`
    examples."""
    args = TrainingArguments(output_dir=str(tmp_path / f"run{batch}x{accumulation}"), optim="sgd", learning_rate=1.0,
                             lr_scheduler_type="constant", max_grad_norm=0.0, max_steps=1,
                             per_device_train_batch_size=batch, gradient_accumulation_steps=accumulation,
                             report_to="none", use_cpu=True, save_strategy="no", **settings)
    Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator).train()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("name", ["talk", "rfa_doc", "talk_lm"])
def test_trainer_gradient_accumulation_equals_one_large_batch(name, tokenizer, lm_tokenizer, tmp_path):
    """Two micro-batches of 2 with very different label counts update the model as one batch of 4: every label
    weighs the same (Trainer's num_items_in_batch reaches the loss), not every micro-batch's mean."""
    lm = name in LM
    # right padding, as LMs are trained (left padding adds a target predicted from a padded position to each padded
    # row, so rows padded in one batch and not in another count differently; the text-generation pipeline sets the
    # shared tokenizer to left padding)
    tok = copy.deepcopy(lm_tokenizer if lm else tokenizer)
    tok.padding_side = "right"
    by_length = sorted(pairs(), key=lambda pair: len(pair[1]))
    texts = by_length[:2] + by_length[-2:]
    if lm:
        dataset = Dataset.from_dict({"input_ids": [tok(t)["input_ids"] for _, t in texts]})
        collator = DataCollatorForLanguageModeling(tok, mlm=False)
    else:
        dataset = Dataset.from_dict(dict(tok([s for s, _ in texts], text_target=[t for _, t in texts])))
        collator = DataCollatorForSeq2Seq(tok, label_pad_token_id=-100)
    # RFA-doc draws new random features at every training forward unless told not to
    settings = dict(vocab_size=len(tok), **({"resample_random_features": False} if name == "rfa_doc" else {}))
    after = [_one_sgd_step(make(name, **settings), dataset, collator, batch, accumulation, tmp_path)
             for batch, accumulation in ((4, 1), (2, 2))]
    before = {n: p.detach() for n, p in make(name, **settings).named_parameters()}
    for key in before:
        torch.testing.assert_close(after[1][key] - before[key], after[0][key] - before[key], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", list(LM))
def test_trainer_label_smoothing_shifts_a_causal_lms_labels(name, lm_tokenizer, tmp_path):
    """Trainer's own label smoother (label_smoothing_factor) trains a talk_hf LM on the next token, as the
    model's config-level smoothing does: the two updates are the same."""
    texts = [pair[1] for pair in pairs()[:4]]
    dataset = Dataset.from_dict({"input_ids": [lm_tokenizer(t)["input_ids"] for t in texts]})
    collator = DataCollatorForLanguageModeling(lm_tokenizer, mlm=False)  # one batch: either padding side will do
    by_trainer = _one_sgd_step(sized(name, lm_tokenizer), dataset, collator, 4, 1, tmp_path,
                               label_smoothing_factor=0.1)
    by_config = _one_sgd_step(make(name, vocab_size=len(lm_tokenizer), label_smoothing=0.1), dataset, collator, 4, 1,
                              tmp_path)
    for key, value in by_config.items():
        torch.testing.assert_close(by_trainer[key], value, rtol=1e-4, atol=1e-6)


def test_seq2seq_trainer_scores_document_windows_with_document_bleu(tokenizer, tmp_path):
    """An RFA-doc model evaluated by Seq2SeqTrainer on document windows, with talk_hf's document_metrics as
    compute_metrics: document-level BLEU of the generated windows' last sentences."""
    from talk_hf.training.corpora import document_windows
    from talk_hf.training.evaluation import document_metrics

    model = sized("rfa_doc", tokenizer)
    model.generation_config = GenerationConfig(
        decoder_start_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, max_new_tokens=12,
    )
    src, tgt = zip(*pairs()[:12])
    sentences = Dataset.from_dict({"doc_id": [i // 4 for i in range(12)], "source": list(src), "target": list(tgt)})
    windows = document_windows(sentences, window=2)
    ds = windows.map(lambda b: tokenizer(b["source"], text_target=b["target"]), batched=True,
                     remove_columns=["source", "target", "doc_id"])
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path / "run"), per_device_eval_batch_size=5,
                                    predict_with_generate=True, report_to="none", use_cpu=True)
    trainer = Seq2SeqTrainer(
        model=model, args=args, eval_dataset=ds, processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=document_metrics(tokenizer, windows["doc_id"]),
    )
    metrics = trainer.evaluate()
    assert 0.0 <= metrics["eval_bleu"] <= 100.0 and 0.0 <= metrics["eval_d_bleu"] <= 100.0
