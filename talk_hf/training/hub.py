"""Upload a saved training run to the Hugging Face Hub (or any Hub-compatible endpoint, see ``HF_ENDPOINT``).

    from talk_hf.training.hub import push_run
    url = push_run("runs/multi30k/talk/model", "me/talk-multi30k-de-en", revision="v1", private=True)

The folder is the one ``scripts/train.py`` writes to ``<output_dir>/model``: weights, ``config.json`` and the
modeling ``.py`` files (``auto_map``), tokenizer files, ``generation_config.json``, the ``README.md`` model card,
``metrics.jsonl`` / ``eval_results.json`` and ``metrics.png``. Everything in it is uploaded in one commit except
training state that does not belong in a model repository (see ``DEFAULT_IGNORE``); the same commit deletes the
repository's weight files and BPE codes that the folder does not have (see ``REPLACED``). The local folder is only
read.
"""

from __future__ import annotations

import fnmatch
import glob
import logging
import warnings
from pathlib import Path

from huggingface_hub import HfApi

__all__ = ["DEFAULT_IGNORE", "REPLACED", "HubUploadError", "push_run"]

logger = logging.getLogger(__name__)

# Training state and caches that a model repository should not carry (optimizer/RNG state, pickled arguments,
# intermediate checkpoints, TensorBoard logs, hidden files such as .cache/ or .git/).
DEFAULT_IGNORE = (
    "checkpoint-*", "checkpoint-*/**", "checkpoints/**", "step-*/**", "runs/**", "optimizer.*", "scheduler.*",
    "scaler.pt", "rng_state*", "training_args.bin", "trainer_state.json", ".*", ".*/**", "**/.*", "**/.*/**",
    "__pycache__/**", "**/__pycache__/**", "*.pyc",
)
# Files at a repository's root whose mere presence changes what loads, so that an earlier push's copies must not
# outlive a push without them: the weights in any layout (transformers loads a leftover model.safetensors before a
# newer sharded index) and subword-nmt codes (a fairseq tokenizer applies BPE when a bpecodes file is there). Those
# the pushed folder lacks are deleted; files in subfolders, and those the folder has (uploaded or ignored), stay. A
# model card and results are not among them: the repository's own (one written on the Hub) stay, and a push without
# a card says so.
REPLACED = ("*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "bpecodes")
_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class HubUploadError(RuntimeError):
    """An upload of a run folder failed; ``repo_id``, ``revision`` and ``step`` say where, ``__cause__`` why."""

    def __init__(self, repo_id: str, revision: str, step: str, reason: str):
        self.repo_id, self.revision, self.step = repo_id, revision, step
        super().__init__(f"pushing to {repo_id} (revision {revision}) failed while trying to {step}: {reason}. "
                         "The local folder was not changed.")


def _check_folder(folder: Path) -> None:
    if not folder.is_dir():
        raise FileNotFoundError(f"no run folder {folder} to push")
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json: save the model with save_pretrained before pushing")
    if not any((folder / name).is_file() for name in _WEIGHTS):
        raise FileNotFoundError(f"{folder} has no weights ({' or '.join(_WEIGHTS)}): nothing to push")
    if not (folder / "README.md").is_file():
        warnings.warn(f"{folder} has no README.md: a model card the repository has stays as it is, and describes "
                      "other weights than these (write one with talk_hf.training.model_card.write_model_card)",
                      stacklevel=3)


def _stale_files(repo_files: list[str], folder: Path) -> list[str]:
    """The branch's root files matching ``REPLACED`` that the folder does not have."""
    return [name for name in repo_files if "/" not in name and not (folder / name).exists()
            and any(fnmatch.fnmatchcase(name, pattern) for pattern in REPLACED)]


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"{type(exc).__name__}: {text}"


def push_run(
    folder: str | Path,
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool | None = None,
    commit_message: str | None = None,
    token: str | bool | None = None,
    ignore_patterns: tuple[str, ...] | list[str] | None = DEFAULT_IGNORE,
) -> str:
    """Upload a saved run folder to ``repo_id`` (one commit for a model-sized folder) and return the commit URL. The
    commit also deletes the branch's root files matching ``REPLACED`` that the folder lacks (weights of an earlier
    layout, BPE codes of an earlier tokenizer).

    Args:
        folder: the saved model folder (``save_pretrained`` output plus tokenizer, card, metrics, plot).
        repo_id: ``"user/name"`` or ``"org/name"`` (a bare ``"name"``: the token's user's); created if missing
            (``exist_ok``).
        revision: a branch to commit to; created from ``main`` when it does not exist yet. None: ``main``.
        private: create the repository private (True) or public (False); None: the Hub's default (public, or
            private where an organisation makes its repositories private by default). An existing repository keeps
            its visibility (a warning is given when it is public and ``private=True`` was asked for).
        commit_message: default ``"Upload <folder name> with talk_hf"``.
        token: Hub token (None: the saved login / ``HF_TOKEN``).
        ignore_patterns: glob patterns of files not to upload (default ``DEFAULT_IGNORE``; None uploads everything).

    Returns:
        str: the commit URL, ``<endpoint>/<namespace>/<name>/commit/<sha>`` (the sha is its last path segment).
        When no file differs from the branch head, huggingface_hub makes no (empty) commit and this is the head's
        URL.

    Raises:
        FileNotFoundError: the folder, its config.json or its weights are missing (nothing was contacted).
        HubUploadError: (a RuntimeError) creating the repository or branch, or the commit, failed; the message names
            the repository, the revision and the step, and the original exception is chained. The local folder is
            never modified or deleted.
    """
    folder = Path(folder)
    _check_folder(folder)
    branch = revision or "main"
    api = HfApi(token=token)
    step = "create the repository"
    try:
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id  # with its namespace
        if private:
            step = "read the repository's visibility"
            if not api.repo_info(repo_id).private:
                warnings.warn(f"{repo_id} already exists and is public: private=True does not change an existing "
                              "repository's visibility", stacklevel=2)
        if branch != "main":
            step = f"create the branch {branch!r}"
            api.create_branch(repo_id, branch=branch, exist_ok=True)
        step = f"list the files of the branch {branch!r}"
        stale = _stale_files(api.list_repo_files(repo_id, revision=branch), folder)
        step = f"commit the files of {folder}"
        info = api.upload_folder(
            repo_id=repo_id, folder_path=folder, revision=branch,
            commit_message=commit_message or f"Upload {folder.name} with talk_hf",
            ignore_patterns=list(ignore_patterns) if ignore_patterns else None,
            delete_patterns=[glob.escape(name) for name in stale] or None,
        )
    except Exception as exc:  # HfHubHTTPError, connection errors, ValueError from the client: all become one error
        raise HubUploadError(repo_id, branch, step, _reason(exc)) from exc
    logger.info("pushed %s to %s@%s: %s", folder, repo_id, branch, info.commit_url)
    return info.commit_url
