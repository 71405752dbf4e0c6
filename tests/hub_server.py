"""A loopback fake of the Hugging Face Hub HTTP API, for tests (stdlib only).

`LocalHub` speaks enough of the Hub protocol used by huggingface_hub 2.4 and transformers 5.23 that the real
client can ``push_to_hub`` / ``upload_folder`` / ``create_branch`` and then ``from_pretrained`` /
``hf_hub_download`` / ``snapshot_download`` against it, over real HTTP on 127.0.0.1.  Nothing leaves the machine.

Using it from another test module (the fixture is imported, pytest then finds it by name; linters may also flag
the test parameters that shadow the import, F811)::

    from tests.hub_server import local_hub  # noqa: F401  (pytest fixture import)

    def test_round_trip(local_hub):          # the server is started, the client points at it,
        model.push_to_hub("user/tiny")       # HF_HOME is an empty temporary folder
        assert "model.safetensors" in local_hub.files("user/tiny")
        assert "POST /api/models/user/tiny/commit/main" in local_hub.requests

    def test_in_a_subprocess(local_hub, tmp_path):
        env = local_hub.subprocess_env(tmp_path / "hf_home")   # HF_ENDPOINT is set before the child imports
        subprocess.run([sys.executable, "-c", "..."], env=env, check=True)

Everything patched by the fixture (environment variables, ``huggingface_hub.constants``, the module-level
``HfApi`` of huggingface_hub, transformers' cached ``HfApi`` and modules cache) is restored afterwards.

Storage model: every repository keeps every commit as a full snapshot ``{path: bytes}``; branches (and tags) point
at commits, so a revision resolves by branch name, tag name or full 40-hex commit sha.  Uploads are always answered
``uploadMode: "regular"`` by ``preupload``, so file contents arrive base64-encoded inside the commit NDJSON and no
LFS/Xet endpoints are needed (fine for test-sized models).  No authentication is enforced; ``private`` is recorded
and reported only.

Failure injection: ``hub.fail_commits = True`` makes the commit endpoint answer ``hub.fail_status`` (500) with a JSON
error ``hub.fail_message``.  Note that ``HfApi.upload_folder`` (with ``hf_xet`` installed) retries 5xx commits with
backoff (6 attempts, ~23 s); set ``hub.fail_status = 422`` there to fail at once.  ``push_to_hub`` does not retry.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import itertools
import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

__all__ = ["HubError", "LocalHub", "local_hub", "point_client_at"]

# URL segment after /api/ -> repo type, and repo type -> prefix of its web/resolve URLs.
_API_REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space", "kernels": "kernel"}
_URL_PREFIXES = {"model": "", "dataset": "datasets/", "space": "spaces/", "kernel": "kernels/"}
_INITIAL_GITATTRIBUTES = (
    b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    b"*.pt filter=lfs diff=lfs merge=lfs -text\n"
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
)
_EMPTY_AGENT_REGISTRY = {"standardEnvVars": [], "harnesses": {}}

# Environment variables that would override HF_HOME (or the endpoint) and therefore break isolation.
_CONFLICTING_ENV = (
    "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HUGGINGFACE_ASSETS_CACHE", "HF_XET_CACHE",
    "HF_MODULES_CACHE", "HF_TOKEN_PATH", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HUGGINGFACE_CO_STAGING", "TRANSFORMERS_CACHE",
)


def git_blob_sha(data: bytes) -> str:
    """Return the git blob sha1 of ``data``: the Hub's oid and ETag for a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _now() -> str:
    """Current UTC time in the Hub's ``%Y-%m-%dT%H:%M:%S.%fZ`` format (milliseconds)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# --------------------------------------------------------------------------------------------------- data model


class HubError(Exception):
    """An HTTP error answer: status, message (JSON ``error`` and ``X-Error-Message``) and ``X-Error-Code``."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.headers, self.extra = dict(headers or {}), dict(extra or {})

    def response(self) -> _Response:
        """Render this error the way the Hub does, so ``hf_raise_for_status`` picks the right exception."""
        ascii_message = self.message.encode("ascii", "replace").decode()  # header values must be latin-1
        headers = {"X-Error-Message": ascii_message, **self.headers}
        if self.code:
            headers["X-Error-Code"] = self.code
        return _Response.json({"error": self.message, **self.extra}, status=self.status, headers=headers)


def _revision_not_found(rev: str) -> HubError:
    return HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")


def _entry_not_found(path: str, commit: Commit | None = None) -> HubError:
    headers = {"X-Repo-Commit": commit.oid} if commit is not None else {}
    return HubError(404, f"Entry not found: {path}", "EntryNotFound", headers)


@dataclass(frozen=True)
class Commit:
    """One commit: its oid, parent oid and the full snapshot of the repository's files."""

    oid: str
    parent: str | None
    files: dict[str, bytes]
    title: str
    message: str
    date: str


@dataclass
class Repo:
    """A stored repository: commits by oid, branch and tag heads, visibility."""

    repo_type: str
    repo_id: str
    private: bool = False
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    created_at: str = field(default_factory=_now)

    def resolve(self, revision: str) -> Commit:
        """Return the commit a branch name, tag name or full commit sha points at (404 RevisionNotFound else)."""
        oid = self.branches.get(revision) or self.tags.get(revision)
        if oid is None and revision in self.commits:
            oid = revision
        if oid is None:
            raise _revision_not_found(revision)
        return self.commits[oid]

    def add_commit(self, branch: str, files: dict[str, bytes], title: str, message: str, oid: str) -> Commit:
        """Record a new snapshot as the head of ``branch`` (created if missing) and return the commit."""
        commit = Commit(oid, self.branches.get(branch), dict(files), title, message, _now())
        self.commits[oid] = commit
        self.branches[branch] = oid
        return commit

    def history(self, revision: str) -> list[Commit]:
        """Commits reachable from ``revision``, newest first."""
        commit: Commit | None = self.resolve(revision)
        out = []
        while commit is not None:
            out.append(commit)
            commit = self.commits.get(commit.parent) if commit.parent else None
        return out

    def next_pr_branch(self) -> str:
        """Name of the next pull-request ref (``refs/pr/N``)."""
        numbers = [int(b.rsplit("/", 1)[1]) for b in self.branches if b.startswith("refs/pr/")]
        return f"refs/pr/{max(numbers, default=0) + 1}"


@dataclass
class _Request:
    """A parsed HTTP request: ``segments`` are the URL-decoded path segments (so quoted ``/`` stays inside one)."""

    method: str
    path: str
    segments: list[str]
    query: dict[str, list[str]]
    body: bytes

    def flag(self, name: str) -> bool:
        """Whether query parameter ``name`` is set to a true value (httpx sends booleans as ``true``)."""
        return (self.query.get(name) or ["false"])[-1].lower() in ("1", "true", "yes")

    def json(self) -> dict:
        return json.loads(self.body or b"{}")


@dataclass
class _Response:
    """A response to write back: status, body, headers."""

    status: int
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"

    @classmethod
    def json(cls, obj, status: int = 200, headers: dict | None = None) -> _Response:
        return cls(status, json.dumps(obj).encode(), dict(headers or {}))


# --------------------------------------------------------------------------------------------------- tree helpers


def _dir_oid(files: dict[str, bytes], directory: str) -> str:
    """A stable oid for a folder, derived from the oids of the files below it."""
    prefix = directory + "/"
    h = hashlib.sha1()
    for p in sorted(files):
        if p.startswith(prefix):
            h.update(p.encode() + b"\0" + git_blob_sha(files[p]).encode())
    return h.hexdigest()


def _folders(files: dict[str, bytes]) -> set[str]:
    """Every folder that contains at least one file."""
    out = set()
    for p in files:
        parts = p.split("/")[:-1]
        out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
    return out


def _entry(files: dict[str, bytes], path: str) -> dict | None:
    """Tree/paths-info entry for ``path``: a file, a folder, or ``None`` when absent."""
    if path in files:
        return {"type": "file", "path": path, "size": len(files[path]), "oid": git_blob_sha(files[path])}
    if path in _folders(files):
        return {"type": "directory", "path": path, "size": 0, "oid": _dir_oid(files, path)}
    return None


def _list_tree(files: dict[str, bytes], directory: str, recursive: bool) -> list[dict]:
    """Entries below ``directory`` ("" = root): direct children, or everything when ``recursive``."""
    prefix = directory + "/" if directory else ""
    names = set()
    for p in list(files) + sorted(_folders(files)):
        if not p.startswith(prefix) or p == directory:
            continue
        rel = p[len(prefix):]
        if recursive or "/" not in rel:
            names.add(p)
    return [_entry(files, p) for p in sorted(names)]


# --------------------------------------------------------------------------------------------------- HTTP layer


class _Handler(BaseHTTPRequestHandler):
    """Reads one request, lets ``LocalHub.handle`` answer it, writes the answer (no body for HEAD)."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format, *args):  # noqa: A002 - silence the default stderr access log
        pass

    def do_GET(self):
        self._serve()

    def do_HEAD(self):
        self._serve()

    def do_POST(self):
        self._serve()

    def do_PUT(self):
        self._serve()

    def do_DELETE(self):
        self._serve()

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        chunks = []
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(self.rfile.read(size))
            self.rfile.readline()  # CRLF after each chunk

    def _serve(self) -> None:
        body = self._read_body()
        split = urlsplit(self.path)
        request = _Request(
            method=self.command,
            path=unquote(split.path),
            segments=[unquote(s) for s in split.path.split("/") if s],
            query=parse_qs(split.query),
            body=body,
        )
        self._write(self.server.hub.handle(request))

    def _write(self, response: _Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    hub: LocalHub


# --------------------------------------------------------------------------------------------------- the hub


class LocalHub:
    """A Hub-compatible HTTP server on 127.0.0.1 (port chosen by the OS), holding repositories in memory.

    Attributes:
        url: base URL, e.g. ``http://127.0.0.1:54321`` (use it as ``HF_ENDPOINT``).
        requests: ``"METHOD /decoded/path"`` of every request received, in order (query strings dropped).
        unhandled: the subset of ``requests`` that hit no route (answered 404 without an ``X-Error-Code``).
        errors: ``"METHOD /path: exception"`` for requests that crashed a route (answered 500); should stay empty.
        repos: ``{(repo_type, repo_id): Repo}``.
        fail_commits: when true, the commit endpoint answers ``fail_status`` with ``{"error": fail_message}``.
        hf_home: the isolated ``HF_HOME`` while ``point_client`` is active (the ``local_hub`` fixture), else None.
    """

    def __init__(self, host: str = "127.0.0.1", user: str = "user"):
        self.user = user
        self.requests: list[str] = []
        self.unhandled: list[str] = []
        self.errors: list[str] = []
        self.repos: dict[tuple[str, str], Repo] = {}
        self.fail_commits = False
        self.fail_status = 500
        self.fail_message = "LocalHub: commit rejected on purpose (fail_commits=True)"
        self.hf_home: Path | None = None
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._server = _Server((host, 0), _Handler)
        self._server.hub = self
        self.url = f"http://{host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="LocalHub", daemon=True)

    # ---- lifecycle

    def start(self) -> LocalHub:
        """Start serving in a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> LocalHub:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- inspection and seeding (for tests; no HTTP involved)

    def repo(self, repo_id: str, repo_type: str = "model") -> Repo:
        """The stored repository (KeyError if it does not exist)."""
        return self.repos[(repo_type, repo_id)]

    def files(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> dict[str, bytes]:
        """Snapshot ``{path: bytes}`` of ``repo_id`` at a branch, tag or commit sha."""
        with self._lock:
            return dict(self.repo(repo_id, repo_type).resolve(revision).files)

    def head(self, repo_id: str, revision: str = "main", repo_type: str = "model") -> str:
        """Commit sha a branch (its head), tag or sha resolves to."""
        with self._lock:
            return self.repo(repo_id, repo_type).resolve(revision).oid

    def create_repo(self, repo_id: str, private: bool = False, repo_type: str = "model") -> Repo:
        """Create a repository with the Hub's initial commit (``.gitattributes`` on ``main``)."""
        with self._lock:
            if (repo_type, repo_id) in self.repos:
                raise ValueError(f"{repo_type} repo {repo_id} already exists")
            return self._create_repo(repo_type, repo_id, private)

    def commit_files(self, repo_id: str, files: dict[str, bytes], branch: str = "main",
                     repo_type: str = "model", title: str = "seed") -> str:
        """Add/overwrite ``files`` on ``branch`` (must exist) without going through HTTP; returns the sha."""
        with self._lock:
            repo = self.repo(repo_id, repo_type)
            snapshot = {**repo.resolve(branch).files, **files}
            return repo.add_commit(branch, snapshot, title, "", self._new_oid(repo, snapshot)).oid

    def requests_matching(self, needle: str) -> list[str]:
        """Logged requests containing ``needle`` (e.g. ``"/resolve/"``)."""
        return [r for r in self.requests if needle in r]

    # ---- client configuration

    def env(self, hf_home: str | os.PathLike) -> dict[str, str]:
        """Environment variables pointing a (sub)process's client at this server, with ``HF_HOME=hf_home``."""
        return _env_for(self.url, Path(hf_home))

    def subprocess_env(self, hf_home: str | os.PathLike) -> dict[str, str]:
        """``os.environ`` plus ``env(hf_home)``, minus variables that would override HF_HOME or force offline."""
        env = {k: v for k, v in os.environ.items() if k not in _CONFLICTING_ENV}
        env.update(self.env(hf_home))
        return env

    def point_client(self, hf_home: str | os.PathLike) -> contextlib.AbstractContextManager:
        """Context manager: point huggingface_hub/transformers in this process at the server (see
        ``point_client_at``) and set ``self.hf_home`` meanwhile."""
        return _pointed(self, Path(hf_home))

    # ---- request handling (called from server threads)

    def handle(self, request: _Request) -> _Response:
        """Log and answer one request; Hub errors become their HTTP answers."""
        line = f"{request.method} {request.path}"
        with self._lock:
            self.requests.append(line)
            try:
                response = self._route(request)
            except HubError as err:
                response = err.response()
            except Exception as exc:  # a malformed request or a LocalHub bug: answer 500, keep serving
                self.errors.append(f"{line}: {exc!r}")
                response = HubError(500, f"LocalHub internal error: {exc!r}").response()
            if response.status == 404 and "X-Error-Code" not in response.headers:
                self.unhandled.append(line)
        return response

    def _route(self, req: _Request) -> _Response:
        segs = req.segments
        if segs[:1] == ["api"]:
            return self._route_api(req, segs[1:])
        return self._route_resolve(req, segs)

    def _route_api(self, req: _Request, segs: list[str]) -> _Response:
        method = "GET" if req.method == "HEAD" else req.method
        if len(segs) == 1:
            simple = {
                ("GET", "whoami-v2"): self._whoami,
                ("POST", "validate-yaml"): self._validate_yaml,
                ("GET", "agent-harnesses"): lambda _req: _Response.json(_EMPTY_AGENT_REGISTRY),
            }
            if (method, segs[0]) in simple:
                return simple[(method, segs[0])](req)
        if segs[:1] == ["repos"] and len(segs) == 2:
            if (method, segs[1]) == ("POST", "create"):
                return self._api_create_repo(req)
            if (method, segs[1]) == ("DELETE", "delete"):
                return self._api_delete_repo(req)
        if len(segs) >= 3 and segs[0] in _API_REPO_TYPES:
            repo = self._get_repo(_API_REPO_TYPES[segs[0]], f"{segs[1]}/{segs[2]}")
            return self._route_repo_api(req, method, repo, segs[3:])
        return self._not_implemented(req)

    def _route_repo_api(self, req: _Request, method: str, repo: Repo, rest: list[str]) -> _Response:
        action, args = (rest[0], rest[1:]) if rest else ("", [])
        table = {
            ("GET", ""): self._repo_info,
            ("GET", "revision"): self._repo_info,
            ("POST", "preupload"): self._preupload,
            ("POST", "commit"): self._commit,
            ("GET", "tree"): self._tree,
            ("POST", "paths-info"): self._paths_info,
            ("GET", "refs"): self._refs,
            ("GET", "commits"): self._commits,
            ("POST", "branch"): self._create_branch,
            ("DELETE", "branch"): self._delete_branch,
            ("POST", "tag"): self._create_tag,
            ("DELETE", "tag"): self._delete_tag,
        }
        if (method, action) not in table or (action not in ("", "refs") and not args):
            return self._not_implemented(req)
        return table[(method, action)](req, repo, args)

    def _route_resolve(self, req: _Request, segs: list[str]) -> _Response:
        repo_type = "model"
        if segs and segs[0] in _API_REPO_TYPES and len(segs) >= 6 and segs[3] == "resolve":
            repo_type, segs = _API_REPO_TYPES[segs[0]], segs[1:]
        if req.method not in ("GET", "HEAD") or len(segs) < 5 or segs[2] != "resolve":
            return self._not_implemented(req)
        repo = self._get_repo(repo_type, f"{segs[0]}/{segs[1]}")
        return self._resolve(repo, segs[3], "/".join(segs[4:]))

    def _not_implemented(self, req: _Request) -> _Response:
        return _Response.json({"error": f"LocalHub: no route for {req.method} {req.path}"}, status=404)

    # ---- helpers

    def _get_repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self.repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, f"Repository not found: {repo_id}", "RepoNotFound")
        return repo

    def _repo_url(self, repo: Repo) -> str:
        return f"{self.url}/{_URL_PREFIXES[repo.repo_type]}{repo.repo_id}"

    def _new_oid(self, repo: Repo, files: dict[str, bytes]) -> str:
        """A fresh 40-hex commit sha (unique even for identical snapshots)."""
        h = hashlib.sha1(f"{repo.repo_type}/{repo.repo_id}#{next(self._counter)}".encode())
        for path in sorted(files):
            h.update(path.encode() + b"\0" + git_blob_sha(files[path]).encode())
        return h.hexdigest()

    def _create_repo(self, repo_type: str, repo_id: str, private: bool) -> Repo:
        repo = Repo(repo_type, repo_id, private)
        files = {".gitattributes": _INITIAL_GITATTRIBUTES}
        repo.add_commit("main", files, "initial commit", "", self._new_oid(repo, files))
        self.repos[(repo_type, repo_id)] = repo
        return repo

    # ---- account and repository routes

    def _whoami(self, req: _Request) -> _Response:
        return _Response.json({"type": "user", "name": self.user, "orgs": [],
                               "auth": {"type": "access_token", "accessToken": {"role": "write"}}})

    def _validate_yaml(self, req: _Request) -> _Response:
        return _Response.json({"errors": [], "warnings": []})

    def _api_create_repo(self, req: _Request) -> _Response:
        payload = req.json()
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or self.user}/{payload['name']}"
        private = payload.get("visibility") == "private" or bool(payload.get("private"))
        existing = self.repos.get((repo_type, repo_id))
        if existing is not None:  # create_repo(exist_ok=True) accepts a 409 and reads "url" from it
            raise HubError(409, "You already created this repo", extra={"url": self._repo_url(existing)})
        repo = self._create_repo(repo_type, repo_id, private)
        return _Response.json({"url": self._repo_url(repo), "name": repo_id, "id": repo_id})

    def _api_delete_repo(self, req: _Request) -> _Response:
        payload = req.json()
        repo_id = f"{payload.get('organization') or self.user}/{payload['name']}"
        repo = self._get_repo(payload.get("type") or "model", repo_id)
        del self.repos[(repo.repo_type, repo.repo_id)]
        return _Response.json({})

    def _repo_info(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        commit = repo.resolve(args[0] if args else "main")
        info = {
            "id": repo.repo_id, "author": repo.repo_id.split("/")[0], "sha": commit.oid,
            "lastModified": commit.date, "createdAt": repo.created_at, "private": repo.private,
            "gated": False, "disabled": False, "downloads": 0, "likes": 0, "tags": [],
            "siblings": [{"rfilename": p} for p in sorted(commit.files)],
        }
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
        return _Response.json(info)

    # ---- upload routes

    def _preupload(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        files = repo.resolve(args[0]).files
        answer = []
        for f in req.json().get("files", []):
            existing = files.get(f["path"])
            answer.append({"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                           "oid": git_blob_sha(existing) if existing is not None else None})
        return _Response.json({"files": answer, "commitOid": repo.resolve(args[0]).oid})

    def _commit(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        if self.fail_commits:
            raise HubError(self.fail_status, self.fail_message)
        branch, pr_url = args[0], None
        if req.flag("create_pr"):
            base, branch = repo.resolve(branch), repo.next_pr_branch()
            repo.branches[branch] = base.oid
            pr_url = f"{self._repo_url(repo)}/discussions/{branch.rsplit('/', 1)[1]}"
        if branch not in repo.branches:  # the Hub commits to branches only; create_branch first
            raise _revision_not_found(branch)
        header, operations = _parse_commit_payload(req.body)
        parent = header.get("parentCommit")
        if parent and parent != repo.branches[branch]:
            raise HubError(412, f"Parent commit {parent} is not the head of {branch}")
        files = _apply_operations(repo.resolve(branch), operations)
        commit = repo.add_commit(branch, files, header.get("summary") or "", header.get("description") or "",
                                 self._new_oid(repo, files))
        return _Response.json({"commitUrl": f"{self._repo_url(repo)}/commit/{commit.oid}",
                               "commitOid": commit.oid, "pullRequestUrl": pr_url, "success": True})

    # ---- listing routes

    def _tree(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        commit = repo.resolve(args[0])
        directory = "/".join(args[1:]).strip("/")
        if directory and directory not in _folders(commit.files):
            raise _entry_not_found(directory, commit)
        return _Response.json(_list_tree(commit.files, directory, req.flag("recursive")))

    def _paths_info(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        files = repo.resolve(args[0]).files
        try:
            paths = json.loads(req.body).get("paths", [])
        except (json.JSONDecodeError, UnicodeDecodeError):
            paths = parse_qs(req.body.decode()).get("paths", [])  # the client sends a form
        entries = [_entry(files, p.strip("/")) for p in paths]
        return _Response.json([e for e in entries if e is not None])

    def _refs(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        def ref(name, prefix, oid):
            return {"name": name, "ref": f"{prefix}{name}", "targetCommit": oid}

        branches = [ref(b, "refs/heads/", o) for b, o in sorted(repo.branches.items()) if not b.startswith("refs/")]
        prs = [{"name": b, "ref": b, "targetCommit": o} for b, o in sorted(repo.branches.items())
               if b.startswith("refs/pr/")]
        tags = [ref(t, "refs/tags/", o) for t, o in sorted(repo.tags.items())]
        return _Response.json({"branches": branches, "tags": tags, "converts": [], "pullRequests": prs})

    def _commits(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        return _Response.json([
            {"id": c.oid, "title": c.title, "message": c.message, "date": c.date,
             "authors": [{"user": self.user}]}
            for c in repo.history(args[0])
        ])

    # ---- branch and tag routes

    def _create_branch(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        branch = args[0]
        if branch in repo.branches:
            raise HubError(409, f"Branch {branch} already exists")
        start = repo.resolve(req.json().get("startingPoint") or "main")
        repo.branches[branch] = start.oid
        return _Response.json({})

    def _delete_branch(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        if args[0] == "main":
            raise HubError(403, "Cannot delete the main branch")
        if repo.branches.pop(args[0], None) is None:
            raise _revision_not_found(args[0])
        return _Response.json({})

    def _create_tag(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        tag = req.json()["tag"]
        if tag in repo.tags:
            raise HubError(409, f"Tag {tag} already exists")
        repo.tags[tag] = repo.resolve(args[0]).oid
        return _Response.json({})

    def _delete_tag(self, req: _Request, repo: Repo, args: list[str]) -> _Response:
        if repo.tags.pop(args[0], None) is None:
            raise _revision_not_found(args[0])
        return _Response.json({})

    # ---- download route

    def _resolve(self, repo: Repo, revision: str, path: str) -> _Response:
        commit = repo.resolve(revision)
        data = commit.files.get(path)
        if data is None:
            raise _entry_not_found(path, commit)
        headers = {"X-Repo-Commit": commit.oid, "ETag": f'"{git_blob_sha(data)}"'}
        return _Response(200, data, headers, content_type="application/octet-stream")



# --------------------------------------------------------------------------------------------------- commits


def _parse_commit_payload(body: bytes) -> tuple[dict, list[dict]]:
    """Split the commit NDJSON into its ``header`` value and the list of operations."""
    header, operations = {}, []
    for line in body.splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if item.get("key") == "header":
            header = item.get("value") or {}
        else:
            operations.append(item)
    return header, operations


def _decode_content(value: dict) -> bytes:
    """Bytes of an inline ``file`` operation (base64, or plain text when ``encoding`` is not base64)."""
    if value.get("encoding") == "base64":
        return base64.b64decode(value["content"])
    return value["content"].encode()


def _apply_operations(base: Commit, operations: list[dict]) -> dict[str, bytes]:
    """The snapshot obtained by applying ``operations`` in order on top of ``base``."""
    files = dict(base.files)
    for op in operations:
        key, value = op.get("key"), op.get("value") or {}
        if key == "file":
            files[value["path"]] = _decode_content(value)
        elif key == "deletedFile":
            if files.pop(value["path"], None) is None:
                raise HubError(404, f"A file with this name doesn't exist: {value['path']}", "EntryNotFound")
        elif key == "deletedFolder":
            prefix = value["path"].rstrip("/") + "/"
            doomed = [p for p in files if p.startswith(prefix)]
            if not doomed:
                raise HubError(404, f"A folder with this name doesn't exist: {value['path']}", "EntryNotFound")
            for p in doomed:
                del files[p]
        elif key == "lfsFile":
            raise HubError(400, "LocalHub stores regular files only (preupload answers uploadMode=regular)")
        else:
            raise HubError(400, f"LocalHub: unsupported commit operation {key!r}")
    return files


# --------------------------------------------------------------------------------------------------- client side

# huggingface_hub.constants values derived from HF_HOME at import time: name -> path relative to HF_HOME.
_HOME_CONSTANTS = {
    "HF_HOME": "",
    "HF_HUB_CACHE": "hub",
    "HUGGINGFACE_HUB_CACHE": "hub",
    "HF_ASSETS_CACHE": "assets",
    "HUGGINGFACE_ASSETS_CACHE": "assets",
    "HF_XET_CACHE": "xet",
    "HF_TOKEN_PATH": "token",
    "HF_STORED_TOKENS_PATH": "stored_tokens",
    "AGENT_HARNESSES_PATH": ".agent_harnesses.json",
    "CHECK_FOR_UPDATE_DONE_PATH": ".check_for_update_done",
    "CHECK_FOR_SKILL_UPDATE_DONE_PATH": ".check_for_skill_update_done",
}
# Modules that copy a cache path at import time: (module, attribute, path relative to HF_HOME).
_COPIED_PATHS = (
    ("huggingface_hub.utils._cache_manager", "HF_HUB_CACHE", "hub"),
    ("huggingface_hub.utils._cache_assets", "HF_ASSETS_CACHE", "assets"),
    ("transformers.utils.hub", "HF_MODULES_CACHE", "modules"),
    ("transformers.utils", "HF_MODULES_CACHE", "modules"),
    ("transformers.dynamic_module_utils", "HF_MODULES_CACHE", "modules"),
    ("transformers.file_utils", "HF_MODULES_CACHE", "modules"),
)


def _env_for(url: str, hf_home: Path) -> dict[str, str]:
    return {
        "HF_ENDPOINT": url,
        "HF_HOME": str(hf_home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def _import_clients() -> None:
    """Import the client modules now, so that none of them copies a patched value at import (and keeps it)."""
    import huggingface_hub.hf_api  # noqa: F401
    import huggingface_hub.utils._cache_assets  # noqa: F401
    import huggingface_hub.utils._cache_manager  # noqa: F401

    with contextlib.suppress(ImportError):
        import transformers.dynamic_module_utils  # noqa: F401
        import transformers.utils.hub  # noqa: F401


def _patch_clients(mp: pytest.MonkeyPatch, url: str, hf_home: Path) -> None:
    """Patch the import-time constants of huggingface_hub/transformers (undone by ``mp``)."""
    from huggingface_hub import constants, hf_api

    mp.setattr(constants, "ENDPOINT", url)
    mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    mp.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)  # also skips the agent-harness registry fetch
    mp.setattr(constants, "HF_HUB_OFFLINE", False)
    for name, rel in _HOME_CONSTANTS.items():
        mp.setattr(constants, name, str(hf_home / rel) if rel else str(hf_home))
    mp.setattr(hf_api.api, "endpoint", url)  # module-level HfApi behind huggingface_hub.create_repo & co.
    for module_name, attr, rel in _COPIED_PATHS:
        module = sys.modules.get(module_name)
        if module is not None and hasattr(module, attr):
            mp.setattr(module, attr, str(hf_home / rel))
    thub = sys.modules.get("transformers.utils.hub")
    if thub is not None and hasattr(thub, "_hf_api"):
        mp.setattr(thub, "_hf_api", None)  # transformers caches an HfApi built with the old endpoint


def _forget_remote_code(hf_home: Path) -> None:
    """Drop sys.path entries and modules that transformers loaded from ``hf_home/modules``."""
    root = str(hf_home)
    sys.path[:] = [p for p in sys.path if not p.startswith(root)]
    for name, module in list(sys.modules.items()):
        if (getattr(module, "__file__", None) or "").startswith(root):
            del sys.modules[name]


@contextlib.contextmanager
def point_client_at(url: str, hf_home: str | os.PathLike) -> Iterator[None]:
    """Point huggingface_hub and transformers *in this process* at ``url``, with an isolated ``HF_HOME``.

    huggingface_hub reads ``HF_ENDPOINT``/``HF_HOME`` at import, so besides the environment variables this patches
    ``huggingface_hub.constants`` (ENDPOINT, HUGGINGFACE_CO_URL_TEMPLATE, cache/token paths, telemetry off,
    offline off), the module-level ``huggingface_hub.hf_api.api.endpoint``, transformers' cached
    ``transformers.utils.hub._hf_api`` and its ``HF_MODULES_CACHE`` copies, and re-creates the HTTP client (so it
    sees ``NO_PROXY``).  Everything is restored on exit.
    """
    from huggingface_hub.utils import _http

    hf_home = Path(hf_home)
    hf_home.mkdir(parents=True, exist_ok=True)
    _import_clients()
    with pytest.MonkeyPatch.context() as mp:
        for name in _CONFLICTING_ENV:
            mp.delenv(name, raising=False)
        for name, value in _env_for(url, hf_home).items():
            mp.setenv(name, value)
        _patch_clients(mp, url, hf_home)
        _http.close_session()
        try:
            yield
        finally:
            _http.close_session()
            _forget_remote_code(hf_home)


@contextlib.contextmanager
def _pointed(hub: LocalHub, hf_home: Path) -> Iterator[LocalHub]:
    with point_client_at(hub.url, hf_home):
        hub.hf_home = hf_home
        try:
            yield hub
        finally:
            hub.hf_home = None


@pytest.fixture
def local_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHub]:
    """A started ``LocalHub`` with huggingface_hub/transformers pointed at it and ``HF_HOME`` in a fresh
    temporary folder (``local_hub.hf_home``); everything is restored and the server stopped afterwards.

    Use from another test module with ``from tests.hub_server import local_hub  # noqa: F401``.
    """
    hf_home = tmp_path_factory.mktemp("hf_home")
    with LocalHub() as hub, hub.point_client(hf_home):
        yield hub
