"""Every code block of README.md and docs/*.md runs in a test, so a path, a flag or a printed result in the docs is
what the code does (issue 22).

COVERAGE names each block by (file, a snippet of its text) and says how it is covered: executed as Python (in order,
one namespace per document, beside set-up objects the document takes as given), run as shell commands (each line, with
the substitutions listed, which make it tiny), executed by another named test, or exempt with a reason.
Command lines of a run shell block that cannot run here are listed, with a reason, in EXEMPT_COMMANDS.
`test_every_block_is_covered_once` fails for a block no entry names (a new block must be run or exempted here), for an
entry, a substitution or an exemption that names nothing (stale), and for a document whose blocks are to run but that
has no `test_<name>_md_blocks_run`, the test that runs its Python and shell blocks in order.

What the shell runs on: a temporary folder holding `scripts/` and `benchmarks/` (links to the repository's) and
`data/`, whose Multi30k and tiny Shakespeare files are the first lines of the bundled ones under the same names
(every other entry a link to the real one; `--wiki_zh_en` reads the repository's archive wherever it runs). The
commands write under `runs/` there, as in the repository. The Hub is the loopback server of tests/hub_server.py.
"""

import gzip
import json
import os
import socket
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from talk_hf import TalkForCausalLM, TalkForConditionalGeneration, TalkLMConfig, train_joint_bpe
from tests import test_readme
from tests.doc_blocks import ROOT, Existing, Exempt, Python, Shell, collect, coverage, line_of, named_command, \
    run_python, run_shell, shell_commands, substitute
from tests.hub_server import local_hub  # noqa: F401  (pytest fixture import)

# ---- what the substitutions put in

TINY_TALK = ("d_model=16 encoder_layers=1 decoder_layers=1 encoder_ffn_dim=32 decoder_ffn_dim=32 encoder_heads=2 "
             "decoder_heads=2 decoder_attention_heads=2 encoder_max_offsets=[2] decoder_max_offsets=[3]")
TINY_LM = "d_model=16 decoder_layers=1 decoder_ffn_dim=32 decoder_heads=2 decoder_max_offsets=[2]"
# the end of a run: 8 test sentences (of 64), 8 validation sentences for BLEU, 6 new tokens
SHORT_TEST = "--test_limit 8 --bleu_sentences 8 --max_new_tokens 6"
MULTI30K = ["--split", "train=data/multi30k/train.de.gz,data/multi30k/train.en.gz",
            "--split", "valid=data/multi30k/val.de.gz,data/multi30k/val.en.gz",
            "--split", "test=data/multi30k/test_2016_flickr.de.gz,data/multi30k/test_2016_flickr.en.gz",
            "--vocab_size", "200"]


def preprocess_multi30k(output_dir):
    return ["python", "scripts/preprocess.py", *MULTI30K, "--output_dir", output_dir]


TINY_RFA_MODEL = """from transformers import AutoTokenizer
from talk_hf.training.models import build_model
tokenizer = AutoTokenizer.from_pretrained("runs/wiki4/data/tokenizer")
model = build_model("rfa_doc", tokenizer, overrides=dict(d_model=16, encoder_layers=1, decoder_layers=1,
    encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_attention_heads=2, decoder_attention_heads=2,
    causal_num_frequencies=8, cross_num_frequencies=8))
model.generation_config.max_new_tokens = 4
model.save_pretrained("runs/wiki4/rfa/model")
tokenizer.save_pretrained("runs/wiki4/rfa/model")
"""
TRAIN_M30K = (f"--data runs/m30k/data --model talk --preset iwslt-de-en --set {TINY_TALK} --output_dir runs/m30k/talk "
              "--max_tokens 512 --max_steps {steps} --gradient_accumulation_steps 2 --schedule inverse_sqrt "
              "--warmup_steps 4000 --label_smoothing 0.1 --mixed_precision bf16 --eval_every 1000 --save_every 1 "
              f"--average_last 5 --test_split test {SHORT_TEST}")
# one learning rate, one warm-up, one update per grid run, 2 test sentences (the results runners' full-size models)
TINY_GRID = "--grid_learning_rates 1e-3 --grid_warmup_steps 1 --grid_steps 1 --max_tokens 256 --test_limit 2"
SHELLS = {"bash", "sh", "shell", "console"}
MAKE_DRY_RUN = "make --dry-run -C {repo}"  # {repo}: the repository (the Makefile's folder)

COVERAGE = {
    # ---- README.md
    ("README.md", "make demo   #"): Shell(
        subs=[("make demo", f"{MAKE_DRY_RUN} demo"), ("make test", f"{MAKE_DRY_RUN} test")],
        why="make demo trains for about 11 minutes and make test is the whole suite: their recipes are printed "
            "(--dry-run) and checked to be scripts/demo.py and pytest; scripts/demo.py itself runs tiny in "
            "tests/training/test_scripts.py::test_demo_smoke"),
    ("README.md", 'translator = pipeline("translation", model=model'): Existing(
        "tests/test_readme.py::test_readme_python_blocks_run", test_readme.python_blocks),
    ("README.md", "trainer = Seq2SeqTrainer("): Existing(
        "tests/test_readme.py::test_readme_python_blocks_run", test_readme.python_blocks),
    ("README.md", "translate_documents(model, tokenizer, [doc_a, doc_b]"): Existing(
        "tests/test_readme.py::test_readme_python_blocks_run", test_readme.python_blocks),
    ("README.md", "pip install sacremoses subword-nmt"): Exempt(
        "converts a released checkpoint that must be downloaded first (no network here); tests/convert runs the "
        "same conversion on checkpoints that fairseq builds and saves"),
    ("README.md", "python scripts/preprocess.py --split train="): Shell(subs=[
        ("--vocab_size 8000", "--vocab_size 200"),
        ("--set d_model=256 encoder_layers=3", f"--set {TINY_TALK}"),
        ("--max_tokens 4096 --max_steps 20000", "--max_tokens 512 --max_steps 2"),
        ("--test_split test", f"--test_split test {SHORT_TEST}"),
        ("--data runs/m30k/data --split test", "--data runs/m30k/data --split test --limit 8"),
    ]),
    # ---- docs/training.md
    ("docs/training.md", "# 1. data: joint BPE"): Shell(
        subs=[
            ("--vocab_size 8000", "--vocab_size 200"),
            # all four splits take ~45 s to encode; zh2en-test is the one read below
            ("--wiki_zh_en --window 4 --vocab_size 16000",
             "--wiki_zh_en --wiki_splits zh2en-test --tokenizer_splits zh2en-test --window 4 --vocab_size 300"),
            ("--vocab_size 4000", "--vocab_size 200"),
            ("--set d_model=256 encoder_layers=3", f"--set {TINY_TALK}"),
            ("--max_tokens 4096 --max_steps 20000", "--max_tokens 512 --max_steps 5"),
            ("--save_every 1000", "--save_every 1"),  # 5 checkpoints, for --average_last 5 and --last 5
            ("--test_split test", f"--test_split test {SHORT_TEST}"),
            # `...`: the arguments of a run; a free port instead of torchrun's 29500 (tests may run side by side)
            ("accelerate launch --multi_gpu --num_processes 2 scripts/train.py ...",
             "accelerate launch --main_process_port {port} --multi_gpu --num_processes 2 scripts/train.py "
             f"--data runs/m30k/data --model talk --set {TINY_TALK} --output_dir runs/m30k/ddp --max_tokens 256 "
             "--max_steps 2 --warmup_steps 1 --bleu_sentences 0 --max_new_tokens 6"),
            ("python scripts/train.py ... --resume", "python scripts/train.py " + TRAIN_M30K.replace("{steps}", "6")
             + " --resume"),  # one update past the run above
            ("--set label_smoothing=0.1 ...", f"--set label_smoothing=0.1 {TINY_LM} --output_dir runs/lm/talk "
             "--max_tokens 512 --max_steps 2 --warmup_steps 1 --bleu_sentences 0"),
            ("--split test --num_beams 5", "--split test --num_beams 5 --limit 8"),
            ("--document_level", "--document_level --limit 6"),
        ],
        # no line of the block makes runs/wiki4/rfa/model: an untrained tiny RFA-doc model for the windows' tokenizer
        # (training one with scripts/train.py costs ~40 s, its validation pass over a whole split)
        before={"--model runs/wiki4/rfa/model": [["python", "tiny_rfa_model.py"]]}),
    ("docs/training.md", "--output_dir runs/results --stages tune"): Shell(
        subs=[("--data runs/demo/data", "--data runs/m30k/data"),  # the tiny data of the block above
              ("--stages tune", f"--stages tune {TINY_GRID}"),
              ("--rows talk --resume", f"--rows talk --resume {TINY_GRID} --max_steps 2 --eval_every 1")]),
    ("docs/training.md", "prepare_translation_data(\"runs/m30k/data\""): Python(
        subs=[("vocab_size=8000", "vocab_size=200"),
              ('["train", "dev", "zh2en-test"]', '["zh2en-test"]')],  # the wiki splits: as in the shell block
        why="runs/wiki1/data/tokenizer (a window-1 run's) is written beforehand, tiny"),
    ("docs/training.md", "translations = translate_documents("): Python(),
    # ---- docs/hub.md
    ("docs/hub.md", 'model.push_to_hub("me/talk-multi30k-de-en")'): Python(),
    ("docs/hub.md", 'revision="<sha>"'): Python(subs=[('revision="<sha>"', 'revision="{sha}"')],
                                                why="<sha>: the head of me/talk-multi30k-de-en"),
    ("docs/hub.md", "--push_to_hub me/talk-multi30k-de-en"): Shell(
        subs=[("--output_dir runs/multi30k/talk ...", f"--output_dir runs/multi30k/talk --set {TINY_TALK} "
               f"--max_tokens 512 --max_steps 2 --warmup_steps 1 --test_split test {SHORT_TEST}")],
        before={"--push_to_hub": [preprocess_multi30k("runs/multi30k/data")]}),  # the data the command names
    ("docs/hub.md", "url = push_run("): Python(),
    ("docs/hub.md", "def test_round_trip(local_hub, tmp_path)"): Python(why="the test it defines is called"),
    # ---- docs/design.md
    ("docs/design.md", "y = ops.talk_conv(x, a_l, a_r"): Python(),
    ("docs/design.md", "y = ops.dynamic_conv(x, logits"): Python(),
    ("docs/design.md", 'cache_implementation="static"'): Python(),
    # ---- docs/benchmarks.md
    ("docs/benchmarks.md", "scripts/results_multi30k.py --data runs/demo/data"): Shell(
        subs=[("make demo", f"{MAKE_DRY_RUN} demo"),
              ("--stages tune", f"--stages tune {TINY_GRID}"),
              ("--stages final --rows talk marian", f"--stages final --rows talk marian {TINY_GRID} --eval_every 1"),
              ("--max_steps 2400", "--max_steps 2")],
        before={"--stages tune": [preprocess_multi30k("runs/demo/data")]},  # what `make demo` prepares
        why="make demo: as in README.md"),
    ("docs/benchmarks.md", "--rows marian@1 --stages final --setting 2e-3 300"): Exempt(
        "trains full-size document models on the whole Wikipedia corpus and translates its test set (hours); the "
        "runner is run small by tests/training/test_scripts.py and --setting by tests/training/test_tuning.py"),
    ("docs/benchmarks.md", "--rows marian@1 --stages final --setting 5e-4 1000"): Exempt(
        "the same runner at another setting (hours); evaluate_model.py --metric loss is run small by "
        "tests/training/test_scripts.py"),
    ("docs/benchmarks.md", "--rows marian@4 --stages final --setting 5e-4 100"): Exempt(
        "the same runner's window-4 rows, from the window-1 models (hours); --init_from_sentence_level is run small "
        "by tests/training/test_scripts.py"),
    ("docs/benchmarks.md", "results_lm.py --output_dir runs/lm --corpora wikitext2 --stages tune"): Exempt(
        "trains the language models at every grid point on the whole of WikiText-2 (hours); the runner's tune and "
        "final stages are run small by tests/training/test_scripts.py"),
    ("docs/benchmarks.md", "--document_decoding streaming --num_beams 1 --max_new_tokens 350"): Exempt(
        "translates the whole test set with a trained document model (25 minutes); both decodings are run small "
        "through evaluate_translation by tests/training/test_document_evaluation.py"),
    ("docs/benchmarks.md", "benchmark_generation.py --from_results"): Shell(
        subs=[("benchmarks/results/cpu_rfa_paper_2026-11-27/speedup_windows_1-60.png", "runs/speedup.png")]),
    ("docs/benchmarks.md", "benchmarks/benchmark_ops.py --device cpu"): Shell(
        subs=[("--lengths 256 1024 4096", "--lengths 64 --warmup 1 --iters 2 --budget 1")]),
}

# Command lines of run shell blocks that cannot run here: (file, snippet of the one command) -> reason.
EXEMPT_COMMANDS = {
    ("docs/training.md", "accelerate launch --multi_gpu --num_processes 4"):
        "needs 4 GPUs; the 2-process CPU line after it runs the same data-parallel loop",
}
TEXTS = test_readme.TEXTS


def test_every_block_is_covered_once():
    blocks = collect()
    assert len(blocks) >= 18
    found = coverage(blocks, COVERAGE)
    assert found.uncovered == [], "blocks no COVERAGE entry names (run them here, or exempt them with a reason):\n" + \
        "\n".join(map(str, found.uncovered))
    assert found.stale == [], f"COVERAGE entries that name no block: {found.stale}"
    assert found.ambiguous == []
    assert set(found.pairs) == set(blocks)
    exempt_found = dict.fromkeys(EXEMPT_COMMANDS, 0)
    for block, (key, how) in found.pairs.items():
        if isinstance(how, Existing):
            assert block.code in how.runs(), f"{block}: not among the blocks {how.test} runs"
        if isinstance(how, Exempt):
            assert how.reason, key
        if isinstance(how, (Python, Shell)):  # a document with blocks to run has the test that runs them
            assert callable(globals().get(doc_test_name(block.file))), f"{doc_test_name(block.file)} is missing"
            assert block.lang in ({"python"} if isinstance(how, Python) else SHELLS), block
            for old, _ in how.subs:  # no stale substitution (also asserted as the block runs)
                assert old in block.code, f"{block}: substitution {old!r} matches nothing"
        if isinstance(how, Shell):
            commands = shell_commands(block.code, block.lang)
            for snippet in how.before:
                named_command(commands, snippet, str(block))
            for file, snippet in EXEMPT_COMMANDS:
                if file == block.file and snippet in block.code:
                    named_command(commands, snippet, str(block))
                    exempt_found[file, snippet] += 1
    assert all(n == 1 for n in exempt_found.values()), f"stale or ambiguous EXEMPT_COMMANDS: {exempt_found}"
    assert all(reason for reason in EXEMPT_COMMANDS.values())


def test_collector_finds_every_fence_and_coverage_names_the_gaps(tmp_path):
    """The collector on a made-up tree: any fence and info string, a document added later; and what `coverage`
    reports for a block nobody covers, an entry naming nothing and an entry naming two blocks."""
    added = "docs" + "/added.md"  # (spelt so that tests/test_docs.py does not take it for a citation)
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# t\n\n```python\nx = 1\n```\n\n  ~~~sh\n  ls\n  ~~~\n\n"
                                        "````\n```bash\nnested\n```\n````\n")
    assert [(b.index, b.lang, b.code) for b in collect(tmp_path)] == [
        (0, "python", "x = 1\n"), (1, "sh", "ls\n"), (2, "", "```bash\nnested\n```\n")]
    (tmp_path / added).write_text("text\n\n```console\n$ python a.py \\\n> --n 1\nprinted\n```\n```bash\nls\n```\n")
    blocks = collect(tmp_path)
    assert [(b.file, b.line) for b in blocks][3:] == [(added, 3), (added, 8)]
    assert shell_commands(blocks[3].code, "console") == [("python a.py --n 1", ["python", "a.py", "--n", "1"])]
    found = coverage(blocks, {("README.md", "x = 1"): Python(), ("README.md", "ls"): Exempt("r"),
                              ("README.md", "gone"): Exempt("r"), (added, "ls"): Exempt("r")})
    assert found.uncovered == [blocks[2], blocks[3]] and found.stale == [("README.md", "gone")]
    assert found.ambiguous == []
    twice = coverage(blocks, {("README.md", "x ="): Python(), ("README.md", "= 1"): Python(),
                              (added, "\n"): Exempt("r")})
    assert twice.ambiguous == [((added, "\n"), [str(blocks[3]), str(blocks[4])]),
                               (str(blocks[0]), [("README.md", "x ="), ("README.md", "= 1")])]


def doc_test_name(file):
    return f"test_{Path(file).stem.lower()}_md_blocks_run"


# ---- running a document


class Context(dict):
    """Fields for the substitutions' replacements; a callable value is called when the field is used."""

    def __getitem__(self, key):
        value = super().__getitem__(key)
        return value() if callable(value) else value


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_document(file, cwd, *, env=None, namespace=None, context=(), fixtures=None, monkeypatch):
    """Run the Python and shell blocks of `file` in order (the others are covered elsewhere); -> (values of the Python
    blocks' expression statements by (file, line), {block index: [(command, stdout)]})."""
    context = Context({"repo": str(ROOT), "port": free_port, **dict(context)})
    env = {**(env if env is not None else os.environ), "TOKENIZERS_PARALLELISM": "false"}
    namespace = {} if namespace is None else namespace
    monkeypatch.chdir(cwd)
    found = coverage(collect(), COVERAGE)
    values, outputs = {}, {}
    blocks = [b for b in found.pairs if b.file == file]
    assert blocks, file
    for block in sorted(blocks, key=lambda b: b.index):
        _, how = found.pairs[block]
        if isinstance(how, Python):
            before = set(namespace)
            run_python(block, substitute(block.code, how.subs, context, str(block)), namespace, values)
            for name in sorted(set(namespace) - before):  # a test the block defines is run, with its fixtures
                if name.startswith("test_") and callable(namespace[name]):
                    code = namespace[name].__code__
                    namespace[name](*[fixtures[arg] for arg in code.co_varnames[:code.co_argcount]])
        elif isinstance(how, Shell):
            skip = [snippet for f, snippet in EXEMPT_COMMANDS if f == file and snippet in block.code]
            outputs[block.index] = run_shell(block, substitute(block.code, how.subs, context, str(block)), how, cwd,
                                             env, skip)
    return values, outputs


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    """data/ with the first 64 lines of each Multi30k file and the first 400 of tiny Shakespeare, same names."""
    data = tmp_path_factory.mktemp("data")
    for entry in (ROOT / "data").iterdir():
        if entry.name in ("multi30k", "tinyshakespeare"):
            (data / entry.name).mkdir()
            for path in entry.glob("*.gz"):
                with gzip.open(path, "rt", encoding="utf-8") as f:
                    head = [line for _, line in zip(range(64 if entry.name == "multi30k" else 400), f)]
                with gzip.open(data / entry.name / path.name, "wt", encoding="utf-8") as f:
                    f.writelines(head)
        else:
            (data / entry.name).symlink_to(entry)
    return data


@pytest.fixture
def workdir(tmp_path, tiny_data):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("scripts", "benchmarks"):
        (work / name).symlink_to(ROOT / name)
    (work / "data").symlink_to(tiny_data)
    return work


def subprocess_env(env=None):
    """The environment of the commands: one thread each (the cores are shared; the 2-process line sets its own), and,
    off the Hub tests, no network (nothing they document needs it)."""
    if env is None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    return {**env, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "model"
    test_readme.save_tiny_demo_model(folder)
    return folder


def load_tiny(folder):
    return TalkForConditionalGeneration.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def value_at(values, file, snippet):
    """The recorded value of the expression statement on the one line of `file`'s blocks containing `snippet`."""
    block, = [b for b in collect() if b.file == file and snippet in b.code]
    return values[file, line_of(block, snippet)]


def read_json(path):
    return json.loads(Path(path).read_text())


# ---- the documents


def test_readme_md_blocks_run(workdir, monkeypatch):
    _, outputs = run_document("README.md", workdir, env=subprocess_env(), monkeypatch=monkeypatch)
    setup, cli = outputs.values()
    assert "scripts/demo.py" in setup[0][1] and "-m pytest" in setup[1][1]
    assert read_json(workdir / "runs/m30k/data/preprocess.json")
    results = read_json(workdir / "runs/m30k/talk/model/eval_results.json")
    assert results["steps"] == 2 and results["test_sentences"] == 8
    assert '"bleu"' in cli[-1][1]  # evaluate_model.py prints its scores


def test_training_md_blocks_run(workdir, tiny_model_dir, monkeypatch):
    (workdir / "tiny_rfa_model.py").write_text(TINY_RFA_MODEL)
    (workdir / "my.de").write_text("Ein Hund rennt.\nZwei Kinder spielen.\n", encoding="utf-8")
    model, tokenizer = load_tiny(tiny_model_dir)
    tokenizer.save_pretrained(workdir / "runs" / "wiki1" / "data" / "tokenizer")
    doc_a, doc_b = ["Ein Hund rennt.", "Er bellt laut."], "Zwei Kinder spielen.\nSie lachen.\n"
    namespace = {"model": model, "tokenizer": tokenizer, "doc_a": doc_a, "doc_b": doc_b, "repo": str(tiny_model_dir)}
    values, _ = run_document("docs/training.md", workdir, env=subprocess_env(), namespace=namespace,
                             monkeypatch=monkeypatch)
    runs = workdir / "runs"
    for split in ("m30k", "wiki4", "lm"):
        assert read_json(runs / split / "data" / "preprocess.json")
    talk = runs / "m30k" / "talk"  # what the text says a run folder holds
    assert {"metrics.jsonl", "metrics.png", "test_hypotheses.txt", "checkpoints", "model"} <= {
        p.name for p in talk.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "generation_config.json", "eval_results.json", "README.md",
            "talk_conv.py"} <= {p.name for p in (talk / "model").iterdir()}
    assert read_json(talk / "eval_results.json")["steps"] == 6  # resumed one update past the first run's 5
    assert len(list((talk / "checkpoints").glob("step-*"))) == 5
    ddp = read_json(runs / "m30k" / "ddp" / "eval_results.json")
    assert ddp["num_processes"] == 2 and ddp["steps"] == 2
    assert read_json(runs / "lm" / "talk" / "model" / "config.json")["model_type"] == "talk_lm"
    assert len((workdir / "my.en").read_text(encoding="utf-8").splitlines()) == 2
    assert (runs / "m30k" / "talk" / "averaged" / "model.safetensors").exists()
    # the python block: the values its comments describe
    translations = namespace["translations"]
    assert [len(doc) for doc in translations] == [2, 2] and all(isinstance(s, str) for d in translations for s in d)
    for call, folder in (("prepare_translation_data(", "m30k"), ("prepare_wiki_zh_en(", "wiki4"),
                         ("prepare_lm_data(", "lm")):  # "writes the folder ... and returns its summary"
        summary = value_at(values, "docs/training.md", call)
        assert json.loads(json.dumps(summary)) == read_json(runs / folder / "data" / "preprocess.json")
    streamed = value_at(values, "docs/training.md", "translate_document_streaming(model, tokenizer, doc_a")
    piped = value_at(values, "docs/training.md", 'pipeline("document-translation"')
    assert isinstance(streamed, list) and len(streamed) == 2
    assert set(piped) == {"translations"} and len(piped["translations"]) == 2


def test_hub_md_blocks_run(local_hub, workdir, tiny_model_dir, tmp_path, monkeypatch):
    model, tokenizer = load_tiny(tiny_model_dir)
    lm_tokenizer = train_joint_bpe(TEXTS, vocab_size=120, min_frequency=1, add_eos=False)
    torch.manual_seed(0)
    lm = TalkForCausalLM(TalkLMConfig(vocab_size=len(lm_tokenizer), d_model=16, decoder_layers=1, decoder_ffn_dim=16,
                                      decoder_heads=2, decoder_max_offsets=[2], pad_token_id=lm_tokenizer.pad_token_id,
                                      eos_token_id=lm_tokenizer.eos_token_id))
    lm.push_to_hub("me/talk-lm")  # the language model the last load line names
    lm_tokenizer.push_to_hub("me/talk-lm")
    repo = "me/talk-multi30k-de-en"
    namespace = {"model": model, "tokenizer": tokenizer}
    _, outputs = run_document(
        "docs/hub.md", workdir, env=subprocess_env(local_hub.subprocess_env(tmp_path / "home")), namespace=namespace,
        context={"sha": lambda: local_hub.head(repo)}, fixtures={"local_hub": local_hub, "tmp_path": tmp_path / "fx"},
        monkeypatch=monkeypatch)
    assert {"model.safetensors", "config.json", "modeling_talk.py", "tokenizer.json"} <= set(local_hub.files(repo))
    assert local_hub.repo("me/talk-private").private
    folder = workdir / "runs" / "multi30k" / "talk" / "model"  # what the text says the folder holds
    assert {"model.safetensors", "modeling_talk.py", "tokenizer.json", "generation_config.json", "README.md",
            "metrics.jsonl", "eval_results.json", "metrics.png"} <= {p.name for p in folder.iterdir()}
    pushed = local_hub.files(repo, "v1")
    assert all(pushed[p.name] == p.read_bytes() for p in folder.iterdir() if p.is_file())
    assert namespace["url"].rsplit("/", 1)[-1] == local_hub.head(repo, "v1")  # "the last segment is the sha"
    assert "pushed to" in next(iter(outputs.values()))[-1][1]
    assert namespace["generator"]("A dog", max_new_tokens=2)[0]["generated_text"].startswith("A dog")
    assert "model.safetensors" in local_hub.files("user/tiny")
    assert local_hub.errors == []


def test_design_md_blocks_run(workdir, tiny_model_dir, monkeypatch):
    model, tokenizer = load_tiny(tiny_model_dir)
    inputs = tokenizer(["Ein Hund rennt.", "Zwei Kinder spielen."], return_tensors="pt", padding=True)
    namespace = {"model": model, "inputs": inputs}
    run_document("docs/design.md", workdir, namespace=namespace, monkeypatch=monkeypatch)
    assert namespace["y"].shape == (2, 100, 512)  # the dynamic_conv block's y, (B, T, C)
    eager = model.generate(**inputs)
    assert torch.equal(namespace["out"], eager)  # "the tokens equal eager decoding"


def test_benchmarks_md_blocks_run(workdir, monkeypatch):
    _, outputs = run_document("docs/benchmarks.md", workdir, env=subprocess_env(), monkeypatch=monkeypatch)
    results, ops, redrawn = outputs.values()
    assert "scripts/demo.py" in results[0][1]
    assert "| paper window 60, batch 3, beam 1 (RFA-doc vs Marian) | 1380 | 107 | 86 | 1.24x |" in redrawn[0][1]
    assert (workdir / "runs" / "speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    grid = (workdir / "runs" / "results" / "grid.md").read_text()
    assert all(f"| {row} | 0.001 | 1 |" in grid for row in ("talk", "dynamic_conv", "lightconv", "marian"))
    table = (workdir / "runs" / "results" / "results.md").read_text()
    assert "| talk | 0.001 | 1 |" in table and "| marian | 0.001 | 1 |" in table and "| lightconv |" not in table
    assert "\n| 64 |" in ops[0][1]  # the table's row for the one length
