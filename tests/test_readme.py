"""The README's Python code blocks run, in order and in one namespace, as a reader would run them: against a tiny
TaLK model saved where the README's blocks expect `make demo`'s model (runs/demo/talk/model), and with the
fine-tuning example's step count cut to 2."""

import os
import re
from pathlib import Path

import torch

from talk_hf import TalkConfig, TalkForConditionalGeneration, train_joint_bpe

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


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    blocks = python_blocks()
    assert len(blocks) >= 3  # quickstart, fine-tuning, document translation
    save_tiny_demo_model(tmp_path / "runs" / "demo" / "talk" / "model")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    namespace = {}
    for block in blocks:
        code = block.replace("max_steps=100", "max_steps=2")
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102  (the README's own code)
    assert namespace["trainer"].state.global_step == 2
    assert os.path.isdir(tmp_path / "runs" / "finetune")
