"""talk_hf.training.hub.push_run against the loopback Hub (tests/hub_server.py), through the real client."""

import hashlib
import json
import struct
import time
import warnings
import zlib
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, ModelCard, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from talk_hf import train_joint_bpe
from talk_hf.training.hub import HubUploadError, push_run
from talk_hf.training.model_card import write_model_card
from tests.hub_server import local_hub  # noqa: F401  (pytest fixture import)
from tests.models.tiny import make

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "multi30k_pairs.tsv"
REPO = "user/talk-run"
# what a run folder holds besides the model, and what push_run leaves out
RUN_FILES = {"metrics.jsonl", "eval_results.json", "metrics.png", "README.md"}
IGNORED = {"optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin", "checkpoint-10/model.safetensors",
           ".cache/huggingface/upload.lock", "__pycache__/x.pyc"}


def png_bytes() -> bytes:
    """A valid 1x1 grey PNG (the run's loss/BLEU plot stand-in)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def tokenizer():
    texts = [t for line in FIXTURE.read_text(encoding="utf-8").splitlines() for t in line.split("\t")]
    return train_joint_bpe(texts, vocab_size=300)


def save_run(folder: Path, tokenizer, seed=0, ignored=True):
    """A run folder as scripts/train.py leaves it: model + code, tokenizer, generation config, card, metrics, plot."""
    model = make("talk", vocab_size=len(tokenizer), seed=seed)
    model.generation_config.num_beams = 4
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    results = {"model": "talk", "parameters": 9000, "steps": 20, "valid_loss": 5.5, "test_bleu": 0.7 + seed,
               "bleu_signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"}
    (folder / "eval_results.json").write_text(json.dumps(results, indent=2) + "\n")
    (folder / "metrics.jsonl").write_text('{"step": 10, "loss": 6.1}\n{"step": 20, "loss": 5.9, "valid_loss": 5.5}\n')
    (folder / "metrics.png").write_bytes(png_bytes())
    write_model_card(folder, model, languages=["de", "en"], license="mit", datasets=["multi30k"], metrics=results,
                     training_args={"learning_rate": 5e-4, "max_steps": 20}, repo_id=REPO)
    if ignored:
        for rel in IGNORED:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(b"training state " + rel.encode())
    return model


def snapshot(folder: Path) -> dict:
    """{relative path: (sha256, size, mtime_ns)} of every file below folder, hidden ones included."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size,
                                         p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_push_run_uploads_the_whole_run_folder(local_hub, tokenizer, tmp_path):
    folder = tmp_path / "model"
    model = save_run(folder, tokenizer)
    before = snapshot(folder)

    url = push_run(folder, REPO)

    sha = local_hub.head(REPO)
    assert url == f"{local_hub.url}/{REPO}/commit/{sha}"
    stored = local_hub.files(REPO)
    local = {rel for rel in before if rel not in IGNORED}
    assert set(stored) == local | {".gitattributes"}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "configuration_talk.py", "modeling_talk.py", "talk_conv.py"} | RUN_FILES <= set(stored)
    assert all(stored[rel] == (folder / rel).read_bytes() for rel in local)
    assert snapshot(folder) == before  # only read

    commit = HfApi().list_repo_commits(REPO)[0]
    assert commit.commit_id == sha and commit.title == "Upload model with talk_hf"
    card = ModelCard.load(REPO)  # downloaded through the client, metadata parsed
    assert card.data.language == ["de", "en"] and card.data.license == "mit" and "talk_hf" in card.data.tags
    bleu = [r.metric_value for r in card.data.eval_results if r.metric_type == "bleu"]
    assert bleu == [0.7]
    assert json.loads(stored["eval_results.json"])["test_bleu"] == 0.7
    assert stored["metrics.png"].startswith(b"\x89PNG")

    loaded = AutoModelForSeq2SeqLM.from_pretrained(REPO)
    assert_same_weights(model, loaded)
    assert loaded.generation_config.num_beams == 4
    assert AutoTokenizer.from_pretrained(REPO)("Ein Hund.")["input_ids"] == tokenizer("Ein Hund.")["input_ids"]
    assert local_hub.repo(REPO).private is False
    assert local_hub.unhandled == [] and local_hub.errors == []


def test_revision_lands_on_a_branch_and_loads_by_revision(local_hub, tokenizer, tmp_path):
    main_model = save_run(tmp_path / "a", tokenizer, seed=0)
    v1_model = save_run(tmp_path / "b", tokenizer, seed=1)
    push_run(tmp_path / "a", REPO)
    main_sha = local_hub.head(REPO)

    url = push_run(tmp_path / "b", REPO, revision="v1", commit_message="second run")

    assert f"POST /api/models/{REPO}/branch/v1" in local_hub.requests
    assert f"POST /api/models/{REPO}/commit/v1" in local_hub.requests
    assert local_hub.head(REPO) == main_sha  # main untouched
    v1_sha = local_hub.head(REPO, "v1")
    assert url.endswith(f"/commit/{v1_sha}") and v1_sha != main_sha
    assert local_hub.files(REPO, "v1")["model.safetensors"] == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert_same_weights(AutoModelForSeq2SeqLM.from_pretrained(REPO, revision="v1"), v1_model)
    assert_same_weights(AutoModelForSeq2SeqLM.from_pretrained(REPO), main_model)
    assert HfApi().list_repo_commits(REPO, revision="v1")[0].title == "second run"
    cards = {rev: ModelCard.load(hf_hub_download(REPO, "README.md", revision=rev)) for rev in ("main", "v1")}
    assert {rev: [r.metric_value for r in card.data.eval_results if r.metric_type == "bleu"]
            for rev, card in cards.items()} == {"main": [0.7], "v1": [1.7]}

    save_run(tmp_path / "b", tokenizer, seed=2)
    again = push_run(tmp_path / "b", REPO, revision="v1")  # the branch exists: accepted, a new commit on it
    assert again.endswith(local_hub.head(REPO, "v1")) and local_hub.head(REPO, "v1") != v1_sha
    n_commits = len(local_hub.repo(REPO).commits)
    # nothing changed: the client makes no empty commit and push_run returns the head's URL
    assert push_run(tmp_path / "b", REPO, revision="v1") == again
    assert len(local_hub.repo(REPO).commits) == n_commits


def test_a_push_replaces_weights_of_another_layout_and_keeps_other_files(local_hub, tokenizer, tmp_path):
    """A single-file run, then a sharded run to the same branch: the repository loads the second (transformers
    loads model.safetensors before an index, so a leftover one would win); files the runs do not write stay."""
    save_run(tmp_path / "a", tokenizer, seed=0)
    push_run(tmp_path / "a", REPO)
    for name in ("notes.md", "adapters/x/adapter_model.safetensors"):
        HfApi().upload_file(path_or_fileobj=b"kept", path_in_repo=name, repo_id=REPO)
    sharded = save_run(tmp_path / "b", tokenizer, seed=1)
    (tmp_path / "b" / "model.safetensors").unlink()
    sharded.save_pretrained(tmp_path / "b", max_shard_size="20KB")
    assert (tmp_path / "b" / "model.safetensors.index.json").is_file()

    push_run(tmp_path / "b", REPO)

    files = local_hub.files(REPO)
    assert "model.safetensors" not in files and "model.safetensors.index.json" in files
    assert files["notes.md"] == files["adapters/x/adapter_model.safetensors"] == b"kept" and "README.md" in files
    assert_same_weights(AutoModelForSeq2SeqLM.from_pretrained(REPO), sharded)

    # a card-only update: the weights it leaves out are ignored files of the folder, not deleted
    (tmp_path / "b" / "README.md").write_text("---\nlicense: mit\n---\nnew card\n")
    push_run(tmp_path / "b", REPO, ignore_patterns=["*.safetensors", "*.safetensors.index.json"])
    files = local_hub.files(REPO)
    assert files["README.md"].endswith(b"new card\n") and "model.safetensors.index.json" in files
    assert_same_weights(AutoModelForSeq2SeqLM.from_pretrained(REPO), sharded)


def test_private_is_recorded(local_hub, tokenizer, tmp_path):
    save_run(tmp_path / "m", tokenizer, ignored=False)
    push_run(tmp_path / "m", "user/secret-run", private=True)
    push_run(tmp_path / "m", "user/open-run")
    assert local_hub.repo("user/secret-run").private is True
    assert local_hub.repo("user/open-run").private is False
    assert HfApi().model_info("user/secret-run").private is True
    with pytest.warns(UserWarning, match="user/open-run already exists and is public"):
        push_run(tmp_path / "m", "user/open-run", private=True)
    assert local_hub.repo("user/open-run").private is False


def test_without_private_the_hub_decides_the_visibility(local_hub, tokenizer, tmp_path, monkeypatch):
    """No visibility is sent (as model.push_to_hub sends none): an organisation whose repositories are private by
    default gets a private one."""
    asked = []
    create = HfApi.create_repo
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: asked.append(kw) or create(self, repo_id,
                                                                                                      **kw))
    save_run(tmp_path / "m", tokenizer, ignored=False)
    push_run(tmp_path / "m", "user/default-visibility")
    assert asked[0]["private"] is None


def test_a_name_without_namespace_goes_to_the_users_repository(local_hub, tokenizer, tmp_path):
    save_run(tmp_path / "m", tokenizer, ignored=False)
    url = push_run(tmp_path / "m", "bare-run")
    assert url == f"{local_hub.url}/user/bare-run/commit/{local_hub.head('user/bare-run')}"
    assert "model.safetensors" in local_hub.files("user/bare-run")


def test_a_push_without_a_card_keeps_the_repositorys_card_and_says_it_describes_other_weights(local_hub, tokenizer,
                                                                                               tmp_path):
    """A card may have been written on the Hub: it is not deleted, and the warning says what it now describes."""
    save_run(tmp_path / "a", tokenizer, seed=0, ignored=False)
    push_run(tmp_path / "a", REPO)
    card = local_hub.files(REPO)["README.md"]
    save_run(tmp_path / "b", tokenizer, seed=1, ignored=False)
    (tmp_path / "b" / "README.md").unlink()
    with pytest.warns(UserWarning, match="no README.md: a model card the repository has stays as it is, and "
                                         "describes other weights than these"):
        push_run(tmp_path / "b", REPO)
    files = local_hub.files(REPO)
    assert files["README.md"] == card
    assert files["model.safetensors"] == (tmp_path / "b" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("revision", [None, "v2"])
def test_failed_upload_raises_and_leaves_the_folder_alone(local_hub, tokenizer, tmp_path, revision):
    save_run(tmp_path / "first", tokenizer, seed=0)
    push_run(tmp_path / "first", REPO)
    heads = dict(local_hub.repo(REPO).branches)
    folder = tmp_path / "model"
    save_run(folder, tokenizer, seed=1)  # other weights, card and metrics: a real commit to make
    before = snapshot(folder)
    local_hub.fail_commits, local_hub.fail_status = True, 422  # 422: no client-side retries

    start = time.monotonic()
    with pytest.raises(HubUploadError) as caught:
        push_run(folder, REPO, revision=revision)
    assert time.monotonic() - start < 10

    err = caught.value
    branch = revision or "main"
    assert isinstance(err, RuntimeError)
    assert (err.repo_id, err.revision) == (REPO, branch)
    message = str(err)
    assert f"pushing to {REPO} (revision {branch}) failed" in message
    assert "commit rejected on purpose" in message and "422" in message
    assert err.step == f"commit the files of {folder}" and str(folder) in message
    assert isinstance(err.__cause__, HfHubHTTPError) and err.__cause__.response.status_code == 422
    assert snapshot(folder) == before  # same files, same bytes, not even touched
    assert local_hub.repo(REPO).branches.get("main") == heads["main"]
    if revision:  # the branch was created before the commit failed; it still points at main's commit
        assert local_hub.head(REPO, revision) == heads["main"]


def test_failing_branch_creation_names_the_step(local_hub, tokenizer, tmp_path):
    save_run(tmp_path / "m", tokenizer, ignored=False)
    push_run(tmp_path / "m", REPO)
    del local_hub.repo(REPO).branches["main"]  # a new branch starts from main: now the server refuses it
    n_commits = len(local_hub.repo(REPO).commits)
    with pytest.raises(HubUploadError, match="revision v4.*create the branch 'v4'.*RevisionNotFoundError") as caught:
        push_run(tmp_path / "m", REPO, revision="v4")
    assert caught.value.step == "create the branch 'v4'"
    assert len(local_hub.repo(REPO).commits) == n_commits and "v4" not in local_hub.repo(REPO).branches


def test_local_problems_are_caught_before_any_request(local_hub, tokenizer, tmp_path):
    with pytest.raises(FileNotFoundError, match="no run folder"):
        push_run(tmp_path / "absent", REPO)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        push_run(tmp_path / "empty", REPO)
    folder = tmp_path / "m"
    save_run(folder, tokenizer, ignored=False)
    (folder / "model.safetensors").rename(tmp_path / "weights")
    with pytest.raises(FileNotFoundError, match="no weights"):
        push_run(folder, REPO)
    assert local_hub.requests == []
    (tmp_path / "weights").rename(folder / "model.safetensors")
    (folder / "README.md").unlink()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        push_run(folder, REPO)
    assert any("no README.md" in str(w.message) for w in caught)
    assert "README.md" not in local_hub.files(REPO)
