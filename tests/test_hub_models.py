"""Hub round trip: every talk_hf model class is pushed with its tokenizer to the loopback Hub (tests/hub_server.py)
by the real huggingface_hub/transformers clients, then loaded back by name in fresh processes, with talk_hf
installed (Auto classes) and without it (trust_remote_code=True): bit-equal weights, identical generations, and
the translation pipeline straight from the repository. Broken repositories give errors naming the problem.

Two child processes load all nine repositories (one with talk_hf, one with `sys.modules['talk_hf'] = None`), so the
whole module takes about 40 s on two busy CPU cores.
"""

import hashlib
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi
from safetensors import SafetensorError
from transformers import AutoConfig, AutoModelForSeq2SeqLM

from talk_hf import train_joint_bpe, translate_document
from tests.hub_server import LocalHub, local_hub  # noqa: F401  (pytest fixture import)
from tests.models.tiny import ALL, LM, SEQ2SEQ, make

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "multi30k_pairs.tsv"
SOURCES = ["Zwei junge Männer spielen Fußball.", "Ein Hund läuft."]  # a padded batch of two
PROMPT = "Ein Hund"
PIPELINE_TEXT = "Ein Mann fährt Fahrrad."
NEW_TOKENS = 6
PIPELINE_TOKENS = 4
DOCUMENT = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen.", "Ein Kind lacht."]


def kind_of(name):
    return "seq2seq" if name in SEQ2SEQ else "lm"


# ---- helpers run in this process AND (as source text) in the child processes, so both compute the same way


def tensor_hashes(model):
    """{name: sha256 of dtype, shape and raw bytes} for every tensor of the state dict."""
    out = {}
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        out[name] = h.hexdigest()
    return out


def generations(model, tokenizer, kind, sources, prompt, new_tokens):
    """Encoded inputs and greedy / beam-2 generated ids (a forced length, so the comparison is not trivial)."""
    if kind == "seq2seq":
        batch = tokenizer(sources, return_tensors="pt", padding=True)
    else:
        batch = tokenizer([prompt], return_tensors="pt")
    out = {"input_ids": batch["input_ids"].tolist()}
    with torch.no_grad():
        for label, beams in (("greedy", 1), ("beam2", 2)):
            ids = model.generate(**batch, num_beams=beams, do_sample=False, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens)
            out[label] = ids.tolist()
    return out


CHILD = """
import json, sys
spec = json.loads(sys.argv[1])
if spec["block_talk_hf"]:
    sys.modules["talk_hf"] = None  # as for a user without the package: `import talk_hf` raises ImportError
import hashlib
import torch
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer, pipeline
if not spec["block_talk_hf"]:
    import talk_hf  # noqa: F401  registers the classes with the Auto factories
{helpers}
remote = spec["block_talk_hf"]
results = {{}}
for name, kind in spec["repos"]:
    repo = "user/" + name
    auto = AutoModelForSeq2SeqLM if kind == "seq2seq" else AutoModelForCausalLM
    entry = {{}}
    if remote:  # without trust_remote_code the user gets an error that says what to do (no prompt: stdin is closed)
        try:
            auto.from_pretrained(repo)
            entry["without_trust"] = None
        except Exception as exc:
            entry["without_trust"] = [type(exc).__name__, str(exc)]
    kwargs = {{"trust_remote_code": True}} if remote else {{}}
    model = auto.from_pretrained(repo, **kwargs).eval()
    tokenizer = AutoTokenizer.from_pretrained(repo, **kwargs)
    entry["class"] = type(model).__module__ + "." + type(model).__name__
    entry["hashes"] = tensor_hashes(model)
    entry["generations"] = generations(model, tokenizer, kind, spec["sources"], spec["prompt"], spec["new_tokens"])
    if kind == "seq2seq":
        translator = pipeline("translation", model=repo, **kwargs)
        entry["pipeline_class"] = type(translator).__module__ + "." + type(translator).__name__
        entry["pipeline"] = translator(spec["pipeline_text"], max_new_tokens=spec["pipeline_tokens"],
                                       min_new_tokens=spec["pipeline_tokens"])
        documents = pipeline("document-translation", model=repo, **kwargs)
        entry["document"] = documents(spec["document"], window=2, max_new_tokens=spec["pipeline_tokens"])
    results[name] = entry
with open(spec["out"], "w") as f:
    json.dump(results, f)
"""


def start_child(hub, tmp_path, *, block_talk_hf):
    """Start a fresh interpreter that loads every pushed repository; returns (process, results file)."""
    tag = "remote" if block_talk_hf else "installed"
    out = tmp_path / f"{tag}.json"
    spec = dict(block_talk_hf=block_talk_hf, repos=[(name, kind_of(name)) for name in ALL], sources=SOURCES,
                prompt=PROMPT, new_tokens=NEW_TOKENS, pipeline_text=PIPELINE_TEXT, pipeline_tokens=PIPELINE_TOKENS,
                document=DOCUMENT, out=str(out))
    helpers = "\n".join(textwrap.dedent(inspect.getsource(f)) for f in (tensor_hashes, generations))
    script = CHILD.format(helpers=helpers)
    process = subprocess.Popen([sys.executable, "-c", script, json.dumps(spec)], env=hub.subprocess_env(tmp_path / tag),
                               cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    return process, out


def child_results(process, out):
    """Wait for a child started by start_child; its results per model name."""
    try:
        _, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
    assert process.returncode == 0, stderr[-4000:]
    return json.loads(out.read_text())


def pairs():
    return [line.split("\t") for line in FIXTURE.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def pushed(tmp_path_factory):
    """All model classes pushed (model + tokenizer) to one loopback Hub; expected values computed here; the two
    child processes run once for the module."""
    texts = [text for pair in pairs() for text in pair]
    tokenizers = {"seq2seq": train_joint_bpe(texts, vocab_size=300),
                  "lm": train_joint_bpe(texts, vocab_size=300, add_eos=False)}
    tmp = tmp_path_factory.mktemp("hub_models")
    with LocalHub() as hub, hub.point_client(tmp / "hf_home"):
        expected, commits = {}, {}
        for name in ALL:
            kind = kind_of(name)
            tokenizer = tokenizers[kind]
            model = make(name, vocab_size=len(tokenizer))
            repo = f"user/{name}"
            model_commit = model.push_to_hub(repo)
            tokenizer_commit = tokenizer.push_to_hub(repo)
            commits[name] = (model_commit.oid, tokenizer_commit.oid)
            pipeline_ids = None
            if kind == "seq2seq":
                pipeline_ids = model.generate(**tokenizer([PIPELINE_TEXT], return_tensors="pt"),
                                              max_new_tokens=PIPELINE_TOKENS, min_new_tokens=PIPELINE_TOKENS)
            expected[name] = {
                "document": ({"translations": translate_document(model, tokenizer, DOCUMENT, window=2,
                                                                 max_new_tokens=PIPELINE_TOKENS)}
                             if kind == "seq2seq" else None),
                "class": f"{type(model).__module__}.{type(model).__name__}",
                "hashes": tensor_hashes(model),
                "generations": generations(model, tokenizer, kind, SOURCES, PROMPT, NEW_TOKENS),
                "translation": (tokenizer.decode(pipeline_ids[0], skip_special_tokens=True).strip()
                                if pipeline_ids is not None else None),
            }
        installed = child_results(*start_child(hub, tmp, block_talk_hf=False))
        remote = child_results(*start_child(hub, tmp, block_talk_hf=True))
        yield {"hub": hub, "expected": expected, "commits": commits, "installed": installed, "remote": remote}


# ---- what landed on the Hub


@pytest.mark.parametrize("name", list(ALL))
def test_push_stores_weights_code_and_tokenizer(pushed, name):
    hub = pushed["hub"]
    repo = f"user/{name}"
    files = hub.files(repo)
    model_commit, tokenizer_commit = pushed["commits"][name]
    assert hub.head(repo) == tokenizer_commit and model_commit in hub.repo(repo).commits
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json"} <= files.keys()
    config = json.loads(files["config.json"])
    head_class = ALL[name][2]
    auto = "AutoModelForSeq2SeqLM" if name in SEQ2SEQ else "AutoModelForCausalLM"
    module, cls = config["auto_map"][auto].split(".")
    assert cls == head_class.__name__ and f"{module}.py" in files  # the code travels with the weights
    config_module = config["auto_map"]["AutoConfig"].split(".")[0]
    assert f"{config_module}.py" in files
    if name in SEQ2SEQ:  # the remote config module imports it, which registers the translation task
        assert "pipeline_translation.py" in files
    assert not any(p.startswith("talk_hf") or "/" in p for p in files)  # flat repository, no package paths
    assert hub.unhandled == [] and hub.errors == []


# ---- loading with talk_hf installed


@pytest.mark.parametrize("name", list(ALL))
def test_fresh_process_with_talk_hf_loads_bit_equal_and_generates_the_same(pushed, name):
    got, want = pushed["installed"][name], pushed["expected"][name]
    assert got["class"] == want["class"]
    assert got["class"].startswith("talk_hf.")  # the registered class, not remote code
    assert got["hashes"].keys() == want["hashes"].keys()
    assert got["hashes"] == want["hashes"]
    assert got["generations"]["input_ids"] == want["generations"]["input_ids"]  # same tokenizer
    for label in ("greedy", "beam2"):
        assert got["generations"][label] == want["generations"][label], label
        prompt_len = len(want["generations"]["input_ids"][0]) if name in LM else 1
        assert all(len(row) == prompt_len + NEW_TOKENS for row in got["generations"][label])


# ---- loading without talk_hf (remote code from the repository)


@pytest.mark.parametrize("name", list(ALL))
def test_fresh_process_without_talk_hf_loads_remote_code(pushed, name):
    got, want = pushed["remote"][name], pushed["expected"][name]
    assert got["class"].startswith("transformers_modules.user.")
    assert got["class"].endswith("." + want["class"].rsplit(".", 1)[1])
    assert got["hashes"] == want["hashes"]
    assert got["generations"] == want["generations"]
    exc_type, message = got["without_trust"]  # and without trust_remote_code a clear refusal
    assert exc_type == "ValueError"
    assert f"user/{name}" in message and "trust_remote_code=True" in message


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_translation_pipeline_from_the_repository_with_talk_hf(pushed, name):
    got, want = pushed["installed"][name], pushed["expected"][name]
    assert got["pipeline_class"] == "talk_hf.pipeline_translation.TranslationPipeline"
    assert got["pipeline"] == [{"translation_text": want["translation"]}]
    assert got["document"] == want["document"]


@pytest.mark.parametrize("name", list(SEQ2SEQ))
def test_translation_pipeline_from_the_repository_without_talk_hf(pushed, name):
    got, want = pushed["remote"][name], pushed["expected"][name]
    assert got["pipeline_class"].startswith("transformers_modules.user.")
    assert got["pipeline_class"].endswith(".pipeline_translation.TranslationPipeline")
    assert got["pipeline"] == [{"translation_text": want["translation"]}]
    assert got["document"] == want["document"]  # pipeline("document-translation") from the repository's code


def test_remote_code_is_fetched_from_the_pushed_commit(pushed):
    hub = pushed["hub"]
    for name in ("talk", "rfa_doc", "dynamic_conv_lm"):
        sha = hub.head(f"user/{name}")
        code = [p for p in hub.files(f"user/{name}") if p.endswith(".py")]
        fetched = hub.requests_matching(f"GET /user/{name}/resolve/{sha}/")
        assert code and all(any(r.endswith("/" + p) for r in fetched) for p in code), (name, code)


# ---- broken repositories


def _saved_files(tmp_path, name="talk"):
    folder = tmp_path / name
    make(name).save_pretrained(folder)
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def _seed(hub, repo, files):
    hub.create_repo(repo)
    return hub.commit_files(repo, files)


def test_missing_weights_file_names_the_repo_and_the_file(local_hub, tmp_path):
    files = _saved_files(tmp_path)
    del files["model.safetensors"]
    _seed(local_hub, "user/no-weights", files)
    with pytest.raises(OSError) as caught:
        AutoModelForSeq2SeqLM.from_pretrained("user/no-weights")
    message = str(caught.value)
    assert "user/no-weights" in message and "model.safetensors" in message
    assert AutoConfig.from_pretrained("user/no-weights").model_type == "talk"  # only the weights are missing


@pytest.mark.parametrize("garbage", [b"\x00 not a safetensors file " * 4, b"\x10\x00\x00\x00\x00\x00\x00\x00{]"],
                         ids=["text", "bad-json-header"])
def test_corrupted_weights_raise_a_clear_error(local_hub, tmp_path, garbage):
    files = _saved_files(tmp_path)
    files["model.safetensors"] = garbage
    _seed(local_hub, "user/corrupt", files)
    with pytest.raises(OSError) as caught:
        AutoModelForSeq2SeqLM.from_pretrained("user/corrupt")
    # talk_hf names the checkpoint and the file; safetensors' own message ("deserializing header") is kept
    message = str(caught.value)
    assert "user/corrupt" in message and "corrupted" in message and "model.safetensors" in message
    assert "deserializing header" in message and isinstance(caught.value.__cause__, SafetensorError)
    assert local_hub.requests_matching("/resolve/") and local_hub.errors == []


def test_truncated_weights_raise_a_clear_error(local_hub, tmp_path):
    files = _saved_files(tmp_path)
    files["model.safetensors"] = files["model.safetensors"][:-64]
    _seed(local_hub, "user/truncated", files)
    with pytest.raises(OSError, match="user/truncated.*corrupted"):
        AutoModelForSeq2SeqLM.from_pretrained("user/truncated")


def test_unknown_model_type_names_the_type(local_hub, tmp_path):
    files = _saved_files(tmp_path)
    config = json.loads(files["config.json"])
    del config["auto_map"]
    files["config.json"] = json.dumps({**config, "model_type": "not_a_model"}).encode()
    _seed(local_hub, "user/unknown-type", files)
    for load in (AutoConfig.from_pretrained, AutoModelForSeq2SeqLM.from_pretrained):
        with pytest.raises(ValueError, match="model type `not_a_model`.*does not recognize this architecture"):
            load("user/unknown-type")


def test_unknown_model_type_with_code_asks_for_trust_remote_code(local_hub, tmp_path):
    files = _saved_files(tmp_path)
    config = json.loads(files["config.json"])
    files["config.json"] = json.dumps({**config, "model_type": "not_a_model"}).encode()
    _seed(local_hub, "user/unknown-type-code", files)
    # (trust_remote_code=False: the default None would first prompt "[y/N]" on an interactive stdin)
    with pytest.raises(ValueError, match="(?s)user/unknown-type-code contains custom code.*trust_remote_code=True"):
        AutoConfig.from_pretrained("user/unknown-type-code", trust_remote_code=False)


def test_config_without_model_type_names_the_repo(local_hub, tmp_path):
    files = _saved_files(tmp_path)
    config = json.loads(files["config.json"])
    files["config.json"] = json.dumps({k: v for k, v in config.items()
                                       if k not in ("model_type", "auto_map")}).encode()
    _seed(local_hub, "user/no-type", files)
    with pytest.raises(ValueError, match="Unrecognized model in user/no-type.*`model_type`"):
        AutoModelForSeq2SeqLM.from_pretrained("user/no-type")


def test_missing_repo_and_revision_name_them(local_hub, tmp_path):
    make("talk").push_to_hub("user/talk")
    with pytest.raises(OSError, match="user/absent"):
        AutoModelForSeq2SeqLM.from_pretrained("user/absent")
    with pytest.raises(OSError, match="no-such-branch"):
        AutoModelForSeq2SeqLM.from_pretrained("user/talk", revision="no-such-branch")
    assert HfApi().model_info("user/talk").sha == local_hub.head("user/talk")
