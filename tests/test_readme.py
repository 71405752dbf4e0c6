"""The README's Python code blocks run, in order and in one namespace, as a reader would run them: against a tiny
TaLK model saved where the README's blocks expect `make demo`'s model (runs/demo/talk/model), and with the
fine-tuning example's step count cut to 2; what their comments say the calls return or print is checked. (The
README's other blocks, and every block of docs/*.md, run in tests/test_doc_blocks.py.)"""

import os
import re
from pathlib import Path

import torch

from talk_hf import TalkConfig, TalkForConditionalGeneration, train_joint_bpe
from tests.doc_blocks import blocks_of, line_of, run_python

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Ein Mann fährt mit dem Fahrrad.", "A man rides a bike.", "Ein Hund rennt.", "A dog runs.",
         "Zwei Kinder spielen.", "Two children play.", "Er bellt laut.", "It barks loudly."] * 4


def python_blocks():
    return re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)


def save_tiny_demo_model(folder):
    tokenizer = train_joint_bpe(TEXTS, vocab_size=120, min_frequency=1)
    torch.manual_seed(0)
    config = TalkConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_ffn_dim=16, decoder_ffn_dim=16, encoder_heads=2, decoder_heads=2,
                        decoder_attention_heads=2, encoder_max_offsets=[2], decoder_max_offsets=[2],
                        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                        decoder_start_token_id=tokenizer.eos_token_id)
    model = TalkForConditionalGeneration(config)
    model.generation_config.max_new_tokens = 6
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def test_readme_python_blocks_run(tmp_path, monkeypatch, capsys):
    blocks = [block for block in blocks_of(ROOT / "README.md") if block.lang == "python"]
    assert [block.code for block in blocks] == python_blocks()
    assert len(blocks) >= 3  # quickstart, fine-tuning, document translation
    save_tiny_demo_model(tmp_path / "runs" / "demo" / "talk" / "model")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    namespace, values = {}, {}  # values: what each top-level expression gave, by its line in README.md
    for block in blocks:
        code = block.code.replace("max_steps=100", "max_steps=2")
        run_python(block, code, namespace, values)  # exec, in namespace (the README's own code)
    assert namespace["trainer"].state.global_step == 2
    assert os.path.isdir(tmp_path / "runs" / "finetune")

    def value(snippet):
        block, = [b for b in blocks if snippet in b.code]
        return values["README.md", line_of(block, snippet)]

    translated = value('translator("Ein Mann')  # [{'translation_text': '...'}]
    assert isinstance(translated, list) and list(translated[0]) == ["translation_text"]
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{'eval_")]
    assert len(printed) == 1 and re.match(r"\{'eval_loss': [\d.]+, 'eval_bleu': [\d.]+, ", printed[0]), printed
    # print(trainer.evaluate())  # {'eval_loss': ..., 'eval_bleu': ..., ...}
    assert [len(doc) for doc in value("translate_documents(model")] == [2, 2]  # one list of sentences per document
    assert len(value("translate_document_streaming(model")) == 2
    assert list(value('pipeline("document-translation"')) == ["translations"]  # {"translations": [...]}
