"""The loopback Hub (`tests/hub_server.py`) driven by the real huggingface_hub / transformers clients over HTTP."""

import http.client
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    create_branch,
    hf_hub_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, BertConfig, BertModel

from tests.hub_server import LocalHub, git_blob_sha, local_hub  # noqa: F401  (pytest fixture import)

REPO = "user/tiny"


def tiny_bert(seed: int) -> BertModel:
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37)
    return BertModel(config).eval()


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def assert_other_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert any(not torch.equal(sa[k], sb[k]) for k in sa)


def test_push_then_from_pretrained_round_trips_bit_exact(local_hub):
    model = tiny_bert(0)
    info = model.push_to_hub(REPO)

    stored = local_hub.files(REPO)
    assert {"config.json", "model.safetensors", "README.md", ".gitattributes"} <= stored.keys()
    assert info.oid == local_hub.head(REPO)
    assert json.loads(stored["config.json"])["hidden_size"] == 32

    loaded = AutoModel.from_pretrained(REPO)
    assert type(loaded) is BertModel
    assert_same_weights(model, loaded)

    sha = local_hub.head(REPO)
    assert "POST /api/repos/create" in local_hub.requests
    assert f"POST /api/models/{REPO}/preupload/main" in local_hub.requests
    assert f"POST /api/models/{REPO}/commit/main" in local_hub.requests
    assert f"GET /{REPO}/resolve/{sha}/model.safetensors" in local_hub.requests
    assert f"GET /{REPO}/resolve/{sha}/config.json" in local_hub.requests
    assert local_hub.requests_matching("/resolve/") == [r for r in local_hub.requests if "/resolve/" in r]
    assert local_hub.unhandled == [] and local_hub.errors == []
    # The download landed in the isolated HF_HOME, not in the user's cache.
    assert (local_hub.hf_home / "hub" / "models--user--tiny" / "snapshots" / sha / "model.safetensors").exists()


def test_second_push_and_branch_and_sha_revisions(local_hub):
    v1, v2 = tiny_bert(1), tiny_bert(2)
    assert_other_weights(v1, v2)
    v1_sha = v1.push_to_hub(REPO).oid
    create_branch(REPO, branch="v1")  # module-level HfApi: its endpoint must be patched too
    v2_sha = v2.push_to_hub(REPO).oid  # the repo exists: repos/create answers 409, accepted via exist_ok

    assert local_hub.requests.count("POST /api/repos/create") == 2
    assert len(local_hub.repos) == 1
    assert v1_sha != v2_sha
    assert local_hub.head(REPO, "v1") == v1_sha and local_hub.head(REPO) == v2_sha
    assert local_hub.files(REPO, "v1")["model.safetensors"] != local_hub.files(REPO)["model.safetensors"]

    assert_same_weights(AutoModel.from_pretrained(REPO), v2)
    assert_same_weights(AutoModel.from_pretrained(REPO, revision="v1"), v1)
    assert_same_weights(AutoModel.from_pretrained(REPO, revision=v1_sha), v1)
    assert_same_weights(AutoModel.from_pretrained(REPO, revision=v2_sha), v2)
    assert f"GET /api/models/{REPO}/revision/v1" in local_hub.requests
    assert local_hub.unhandled == []


def test_push_to_new_branch_and_pull_request(local_hub):
    BertConfig(hidden_size=32, num_attention_heads=2).push_to_hub(REPO)
    BertConfig(hidden_size=48, num_attention_heads=2).push_to_hub(REPO, revision="dev")  # create_branch + commit
    BertConfig(hidden_size=64, num_attention_heads=2).push_to_hub(REPO, revision="dev")  # branch exists: 409 ok
    pr = BertConfig(hidden_size=80, num_attention_heads=2).push_to_hub(REPO, create_pr=True)

    assert pr.pr_url.endswith(f"/{REPO}/discussions/1")
    assert local_hub.requests.count(f"POST /api/models/{REPO}/branch/dev") == 2
    assert AutoConfig.from_pretrained(REPO).hidden_size == 32
    assert AutoConfig.from_pretrained(REPO, revision="dev").hidden_size == 64
    assert AutoConfig.from_pretrained(REPO, revision="refs/pr/1").hidden_size == 80
    refs = HfApi().list_repo_refs(REPO, include_pull_requests=True)
    assert {b.name for b in refs.branches} == {"main", "dev"}
    assert [p.ref for p in refs.pull_requests] == ["refs/pr/1"]
    titles = [c.title for c in HfApi().list_repo_commits(REPO, revision="dev")]
    assert titles == ["Upload config", "Upload config", "Upload config", "initial commit"]

    with pytest.raises(RevisionNotFoundError):  # the Hub commits to existing branches only
        HfApi().upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO, revision="nope")


def test_private_flag_is_recorded_and_reported(local_hub):
    tiny_bert(0).push_to_hub("user/secret", private=True)
    BertConfig().push_to_hub("user/open")

    assert local_hub.repo("user/secret").private is True
    assert local_hub.repo("user/open").private is False
    api = HfApi()
    assert api.model_info("user/secret").private is True
    assert api.model_info("user/open").private is False


def test_whoami_dataset_repos_and_delete_repo(local_hub):
    api = HfApi()
    assert api.whoami(token="hf_dummy")["name"] == "user"
    api.create_repo("user/data", repo_type="dataset")
    api.upload_file(path_or_fileobj=b"a,b\n1,2\n", path_in_repo="train.csv", repo_id="user/data",
                    repo_type="dataset")
    with open(hf_hub_download("user/data", "train.csv", repo_type="dataset")) as f:
        assert f.read() == "a,b\n1,2\n"
    assert local_hub.files("user/data", repo_type="dataset")["train.csv"] == b"a,b\n1,2\n"
    assert "GET /datasets/user/data/resolve/main/train.csv" in local_hub.requests  # no repo_info first
    with pytest.raises(RepositoryNotFoundError):  # same name, other type
        hf_hub_download("user/data", "train.csv")

    api.delete_repo("user/data", repo_type="dataset")
    assert local_hub.repos == {}
    with pytest.raises(RepositoryNotFoundError):
        api.dataset_info("user/data")


def test_missing_repo_file_and_revision_raise_the_client_errors(local_hub):
    local_hub.create_repo(REPO)
    local_hub.commit_files(REPO, {"config.json": b"{}"})

    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("user/missing", "config.json")
    with pytest.raises(OSError, match="user/missing"):
        AutoModel.from_pretrained("user/missing")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "absent.bin")
    # The 404 carries X-Repo-Commit, so the client caches the file's absence for that commit.
    no_exist = local_hub.hf_home / "hub" / "models--user--tiny" / ".no_exist" / local_hub.head(REPO) / "absent.bin"
    assert no_exist.exists()
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="no-such-branch")
    with pytest.raises(OSError, match="no-such-branch"):
        AutoConfig.from_pretrained(REPO, revision="no-such-branch")
    assert hf_hub_download(REPO, "config.json").endswith("config.json")
    assert local_hub.unhandled == []


def test_tree_paths_info_deletions_tags_via_hfapi(local_hub, tmp_path):
    api = HfApi()
    api.create_repo(REPO)
    folder = tmp_path / "upload"
    (folder / "a" / "c").mkdir(parents=True)
    (folder / "top.txt").write_text("top")
    (folder / "a" / "b.txt").write_text("b")
    (folder / "a" / "c" / "d.txt").write_text("d")
    api.upload_folder(folder_path=folder, repo_id=REPO)

    recursive = {(e.path, type(e).__name__) for e in api.list_repo_tree(REPO, recursive=True)}
    assert recursive == {(".gitattributes", "RepoFile"), ("top.txt", "RepoFile"), ("a", "RepoFolder"),
                         ("a/b.txt", "RepoFile"), ("a/c", "RepoFolder"), ("a/c/d.txt", "RepoFile")}
    assert {e.path for e in api.list_repo_tree(REPO)} == {".gitattributes", "top.txt", "a"}
    assert {e.path for e in api.list_repo_tree(REPO, path_in_repo="a")} == {"a/b.txt", "a/c"}
    infos = api.get_paths_info(REPO, ["top.txt", "a", "missing.txt"])
    assert {(i.path, type(i).__name__) for i in infos} == {("top.txt", "RepoFile"), ("a", "RepoFolder")}
    assert api.file_exists(REPO, "a/c/d.txt") and not api.file_exists(REPO, "a/c/zzz.txt")

    api.create_tag(REPO, tag="before-delete")
    api.create_commit(REPO, operations=[CommitOperationDelete("top.txt"), CommitOperationDelete("a/c/"),
                                        CommitOperationAdd("new.txt", b"new")], commit_message="prune")
    assert set(local_hub.files(REPO)) == {".gitattributes", "a/b.txt", "new.txt"}
    assert local_hub.files(REPO, "before-delete")["top.txt"] == b"top"
    with open(hf_hub_download(REPO, "a/c/d.txt", revision="before-delete")) as f:
        assert f.read() == "d"
    with pytest.raises(EntryNotFoundError):
        api.delete_file("top.txt", repo_id=REPO)
    stale_parent = local_hub.head(REPO, "before-delete")
    with pytest.raises(HfHubHTTPError) as caught:
        api.create_commit(REPO, operations=[CommitOperationAdd("z.txt", b"z")], commit_message="stale",
                          parent_commit=stale_parent)
    assert caught.value.response.status_code == 412
    assert "z.txt" not in local_hub.files(REPO)
    assert local_hub.unhandled == []


def test_failed_commits_raise_and_leave_the_repo_unchanged(local_hub):
    tiny_bert(0).push_to_hub(REPO)
    head = local_hub.head(REPO)
    local_hub.fail_commits = True

    with pytest.raises(HfHubHTTPError) as caught:
        tiny_bert(1).push_to_hub(REPO)
    assert caught.value.response.status_code == 500
    assert "commit rejected on purpose" in str(caught.value)
    assert local_hub.head(REPO) == head
    assert local_hub.requests[-1] == f"POST /api/models/{REPO}/commit/main"

    local_hub.fail_commits = False
    tiny_bert(1).push_to_hub(REPO)
    assert local_hub.head(REPO) != head


def test_fresh_subprocess_loads_with_the_env_vars(local_hub, tmp_path):
    model = tiny_bert(3)
    model.push_to_hub(REPO)
    out = tmp_path / "child.safetensors"
    script = textwrap.dedent(f"""
        import os
        from huggingface_hub import constants
        assert constants.ENDPOINT == os.environ["HF_ENDPOINT"], constants.ENDPOINT
        from safetensors.torch import save_file
        from transformers import AutoModel
        model = AutoModel.from_pretrained({REPO!r})
        save_file({{k: v.contiguous() for k, v in model.state_dict().items()}}, {str(out)!r})
        print(constants.HF_HUB_CACHE)
    """)
    child_home = tmp_path / "child_home"
    n_before = len(local_hub.requests)
    result = subprocess.run([sys.executable, "-c", script], env=local_hub.subprocess_env(child_home),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == str(child_home / "hub")

    child = load_file(out)
    assert child.keys() == model.state_dict().keys()
    assert all(torch.equal(child[k], v) for k, v in model.state_dict().items())
    assert f"GET /{REPO}/resolve/{local_hub.head(REPO)}/model.safetensors" in local_hub.requests[n_before:]


def test_point_client_restores_everything(tmp_path):
    import transformers.utils.hub as thub
    from huggingface_hub import hf_api

    sentinel = object()
    saved_api, thub._hf_api = thub._hf_api, sentinel
    try:
        before = (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE,
                  hf_api.api.endpoint, thub.HF_MODULES_CACHE)
        with LocalHub() as hub, hub.point_client(tmp_path / "home"):
            assert constants.ENDPOINT == hub.url == hf_api.api.endpoint
            assert constants.HUGGINGFACE_CO_URL_TEMPLATE.startswith(hub.url + "/")
            assert constants.HF_HUB_CACHE == str(tmp_path / "home" / "hub")
            assert thub.HF_MODULES_CACHE == str(tmp_path / "home" / "modules")
            assert thub._hf_api is None
            assert thub.hf_api().endpoint == hub.url
            assert hub.hf_home == tmp_path / "home"
        after = (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, constants.HF_HUB_CACHE,
                 hf_api.api.endpoint, thub.HF_MODULES_CACHE)
        assert after == before
        assert thub._hf_api is sentinel
        assert hub.hf_home is None
    finally:
        thub._hf_api = saved_api


def test_raw_http_headers_chunked_bodies_and_unknown_routes():
    with LocalHub() as hub:
        hub.create_repo(REPO)
        sha = hub.commit_files(REPO, {"w.bin": b"weights"})
        conn = http.client.HTTPConnection(hub.url.removeprefix("http://"), timeout=10)

        conn.request("HEAD", f"/{REPO}/resolve/main/w.bin")
        head = conn.getresponse()
        assert head.status == 200 and head.read() == b""
        assert head.getheader("X-Repo-Commit") == sha
        assert head.getheader("ETag") == f'"{git_blob_sha(b"weights")}"'
        assert head.getheader("Content-Length") == "7"

        conn.request("HEAD", f"/{REPO}/resolve/{sha[:7]}/w.bin")  # only full shas resolve
        short = conn.getresponse()
        short.read()
        assert (short.status, short.getheader("X-Error-Code")) == (404, "RevisionNotFound")

        body = iter([b'{"name": "chunked", ', b'"organization": "org"}'])
        conn.request("POST", "/api/repos/create", body=body, encode_chunked=True,
                     headers={"Content-Type": "application/json"})
        created = conn.getresponse()
        assert created.status == 200 and json.loads(created.read())["name"] == "org/chunked"
        assert ("model", "org/chunked") in hub.repos

        conn.request("GET", "/api/spaces-nope/x")
        unknown = conn.getresponse()
        unknown.read()
        assert unknown.status == 404 and hub.unhandled == ["GET /api/spaces-nope/x"]

        conn.request("POST", f"/api/models/{REPO}/commit/main", body=b"not json")
        broken = conn.getresponse()
        broken.read()
        assert broken.status == 500 and len(hub.errors) == 1
        conn.close()
