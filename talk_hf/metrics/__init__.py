"""`evaluate` metric modules shipped with talk_hf, as local paths for `evaluate.load` (offline; each folder can also
be pushed to the Hub as it is)."""

from pathlib import Path

DOCUMENT_BLEU = str(Path(__file__).resolve().parent / "document_bleu")
