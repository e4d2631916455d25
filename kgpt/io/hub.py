"""Presets on the Hugging Face Hub: `hf://OWNER/REPO[@REVISION]` wherever kgpt takes a preset.

Everything goes through `huggingface_hub`, so its cache, resumable downloads,
login token (`hf auth login`, `HF_TOKEN`), `HF_HUB_OFFLINE` and `HF_ENDPOINT`
work as in every other library of the field. A repository holds either a kgpt
preset (keras-hub's layout, used as it is downloaded) or Hugging Face's
`openai-gpt` files (config, `model.safetensors` or `tf_model.h5`, `vocab.json`,
`merges.txt`), which are converted once into a kgpt preset kept under the
repository's commit (`cache_dir()`): a later start with the same commit reads
no weights again. Pickled weights (`pytorch_model.bin`) are never read.

One metadata request resolves a branch to its commit; a revision given as a
full commit hash, or `HF_HUB_OFFLINE=1`, makes no request when the preset is
cached. Every wait is bounded by `HF_HUB_ETAG_TIMEOUT` (seconds, default 10).
"""

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import tempfile
import urllib.parse

from kgpt.errors import CheckpointError
from kgpt.io import storage
from kgpt.io.presets import CONFIG_FILE, MODEL_FILES, MODEL_WEIGHTS_FILE, PARTIAL_DIR, read_json

PREFIX = "hf://"
# The released GPT-1, as keras-hub names its presets: Hugging Face's copy of the original weights.
PRESETS = {
    "gpt1_base_en": {
        "uri": "hf://openai-community/openai-gpt",
        "description": "GPT-1 as released by OpenAI (Radford et al., 2018): 12 layers, 768 hidden, 12 heads, "
        "512 tokens of context, 40,478 BPE tokens, pre-trained on BooksCorpus; 116.5M weights.",
    },
}
# The files of an openai-gpt repository that kgpt reads, weights by preference: both formats are free of pickle.
OPENAI_WEIGHTS = ("model.safetensors", "tf_model.h5")
OPENAI_TOKENIZER = ("vocab.json", "merges.txt")
PICKLED = re.compile(r".*\.(bin|pt|pth|ckpt|pkl|msgpack|ot)$")
_COMMIT = re.compile(r"[0-9a-f]{40}")
# What upload_preset sends of a folder: keras-hub's preset layout (presets.MODEL_FILES, shards, the tokenizer's
# tokenizer.json and assets/), the BPE files of a converted preset, and a run's scores.
UPLOADED = [
    *sorted(MODEL_FILES),
    "model_*.weights.h5",
    "tokenizer.json",
    "assets/*",
    "vocab.json",
    "merges.txt",
    "metrics.json",
    "README.md",
]
_WEIGHTS = (".h5", ".safetensors")
_READY = "kgpt-converted.json"  # written last into a converted preset: its presence means the folder is whole

log = logging.getLogger("kgpt")


def is_hub(preset):
    """Whether `preset` names a Hub repository (`hf://...`) or one of kgpt's named presets."""
    return isinstance(preset, str) and (preset.startswith(PREFIX) or preset in PRESETS)


def parse(preset):
    """`(repo_id, revision)` of `hf://OWNER/REPO[@REVISION]` or a named preset; revision None is the main branch."""
    uri = PRESETS[preset]["uri"] if preset in PRESETS else preset
    handle = uri[len(PREFIX) :]
    repo_id, _, revision = handle.partition("@")
    parts = repo_id.split("/")
    if (
        not (1 <= len(parts) <= 2)
        or not all(re.fullmatch(r"[\w.-]+", p) for p in parts)
        or "@" in revision
        or (_ and not revision)
    ):
        raise CheckpointError(
            f"{preset!r} is not a Hub preset: write hf://OWNER/REPO, or hf://OWNER/REPO@REVISION "
            f"for a branch, tag or commit."
        )
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise CheckpointError(f"{preset!r} is not a Hub repository name ({e}).") from None
    return repo_id, revision or None


def cache_dir():
    """Where converted presets are kept: `$KGPT_CACHE`, else `$XDG_CACHE_HOME/kgpt`, else `~/.cache/kgpt`."""
    root = os.environ.get("KGPT_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "kgpt")
    return os.path.join(os.path.expanduser(root), "hub")


@contextlib.contextmanager
def _hub_errors(preset, repo_id, revision):
    """Turns `huggingface_hub`'s errors into one `CheckpointError` line naming the repository."""
    from huggingface_hub import constants, errors

    try:
        yield
    except CheckpointError:
        raise
    except Exception as error:
        where = f"{preset} ({constants.ENDPOINT})"
        if isinstance(error, errors.GatedRepoError):
            message = f"{where} is gated: accept its terms on the Hub, then log in (`hf auth login`) or set HF_TOKEN."
        elif isinstance(error, errors.RevisionNotFoundError):
            message = f"{where}: no revision {revision!r} (a branch, tag or commit of {repo_id})."
        elif isinstance(error, errors.RepositoryNotFoundError):
            message = (
                f"{where}: no such repository, or it is private: check the name, or log in "
                f"(`hf auth login`) or set HF_TOKEN for a private one."
            )
        elif isinstance(error, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError)):
            message = (
                f"{preset}: a file of it is not in the local cache and HF_HUB_OFFLINE is set (or the Hub "
                f"cannot be reached): load it once online, or pass a local preset folder."
            )
        elif _unreachable(error):
            message = (
                f"{where}: cannot reach the Hub ({type(error).__name__}: {str(error)[:120]}). Check the "
                f"network or HF_ENDPOINT; HF_HUB_OFFLINE=1 uses presets already downloaded."
            )
        elif _server_error(error):
            message = (
                f"{where}: the Hub failed on its side (HTTP {error.response.status_code}) and nothing of it is "
                f"cached: try again later."
            )
        elif isinstance(error, errors.HfHubHTTPError):
            message = f"{where}: the Hub answered {str(error).splitlines()[0][:200]}"
        else:
            raise
        raise CheckpointError(message) from error


def _commit_and_files(preset, repo_id, revision, offline):
    """`(commit, {path: sha256 or None})` of the revision; offline, the commit it had when last online, no listing.

    kgpt keeps each revision's commit beside its converted presets (files
    downloaded by commit leave huggingface_hub's own refs untouched).
    """
    from huggingface_hub import HfApi, constants

    ref = os.path.join(_repo_cache(repo_id), "refs", urllib.parse.quote(revision or "main", safe=""))
    if offline:
        if revision and _COMMIT.fullmatch(revision):
            return revision, None
        try:
            with open(ref, encoding="utf-8") as f:
                return f.read().strip(), None
        except OSError:
            raise CheckpointError(
                f"{preset} is not in the local cache and HF_HUB_OFFLINE is set (or the Hub "
                f"cannot be reached): load it once online, or pass a local preset folder."
            ) from None
    info = HfApi().model_info(repo_id, revision=revision, files_metadata=True, timeout=constants.HF_HUB_ETAG_TIMEOUT)
    try:
        os.makedirs(os.path.dirname(ref), exist_ok=True)
        with open(f"{ref}.{os.getpid()}.tmp", "w", encoding="utf-8") as f:
            f.write(info.sha)
        os.replace(f"{ref}.{os.getpid()}.tmp", ref)
    except OSError:
        pass  # a cache that cannot be written only costs the offline fallback; a conversion names it
    files = {s.rfilename: (s.lfs.sha256 if getattr(s, "lfs", None) else None) for s in info.siblings or []}
    return info.sha, files


def _repo_cache(repo_id):
    return os.path.join(cache_dir(), repo_id.replace("/", "--"))


def _download(repo_id, commit, name, sha256=None):
    """A file of the commit, from the cache or the Hub; checked against the Hub's sha256 when it gave one.

    A cached copy that no longer matches (damaged on disk) is fetched again
    once; a download that still does not match is refused by name.
    """
    from huggingface_hub import hf_hub_download

    path = hf_hub_download(repo_id, name, revision=commit)
    if sha256 is None or _sha256(path) == sha256:
        return path
    log.warning(
        f"{name} of {repo_id}@{commit[:12]} in the cache does not match the Hub's checksum: downloading it again."
    )
    path = hf_hub_download(repo_id, name, revision=commit, force_download=True)
    if _sha256(path) != sha256:
        raise CheckpointError(
            f"hf://{repo_id}@{commit}: {name} does not match the sha256 the Hub lists for it "
            f"(corrupt or incomplete download); nothing was loaded."
        )
    return path


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _layout(preset, config_path, files):
    """`"kgpt"` or `"openai-gpt"` from the repository's config.json; any other model is refused by name."""
    config = read_json(config_path, "a kgpt preset's or an openai-gpt model's config")
    if not isinstance(config, dict):
        raise CheckpointError(f"{preset}: its {CONFIG_FILE} is not a JSON object.")
    name = config.get("registered_name")
    if isinstance(name, str):
        if name.startswith("kgpt>"):
            return "kgpt"
        raise CheckpointError(
            f"{preset} is a keras-hub preset of {name!r}, not a kgpt model: load it with keras-hub "
            f"(e.g. keras_hub.models.Backbone.from_preset)."
        )
    kind = config.get("model_type")
    if kind == "openai-gpt":
        return "openai-gpt"
    if kind is not None:
        architectures = ", ".join(config.get("architectures") or []) or "no architectures listed"
        raise CheckpointError(
            f"{preset} holds a {kind!r} model ({architectures}), not GPT-1: kgpt loads openai-gpt "
            f"repositories and kgpt presets."
        )
    raise CheckpointError(
        f"{preset}: its {CONFIG_FILE} names neither a kgpt class (registered_name) nor a "
        f"transformers model_type; it is not a preset kgpt can load."
    )


def _kgpt_files(files):
    """The files of a kgpt preset repository that loading reads (keras-hub's layout)."""
    return {
        name: sha
        for name, sha in files.items()  # top level only: never a pushed run's checkpoints
        if ("/" not in name and name.endswith((".json", ".h5"))) or name.startswith("assets/")
    }


def _openai_files(preset, files, cached_only=False):
    """The files of an openai-gpt repository to convert: config, the first weights format held, the BPE files.

    With `cached_only` (offline), `files` lists what the cache holds, not the
    repository: a file missing there is wanted anyway, so that reading it
    fails as not cached rather than as not in the repository.
    """
    weights = next((name for name in OPENAI_WEIGHTS if name in files), None)
    if cached_only:
        return {name: None for name in (CONFIG_FILE, weights or OPENAI_WEIGHTS[0], *OPENAI_TOKENIZER)}
    if weights is None:
        pickled = sorted(name for name in files if PICKLED.match(name))
        if pickled:
            raise CheckpointError(
                f"{preset} holds its weights only as {', '.join(pickled)} (pickle, which can run "
                f"code when read): kgpt reads model.safetensors or tf_model.h5. Convert the "
                f"weights to safetensors, or load a repository that has them."
            )
        raise CheckpointError(f"{preset} holds no weights kgpt reads (model.safetensors or tf_model.h5).")
    missing = [name for name in OPENAI_TOKENIZER if name not in files]
    if missing:
        raise CheckpointError(f"{preset} has no {' or '.join(missing)}: the BPE files of the openai-gpt tokenizer.")
    return {name: files[name] for name in (CONFIG_FILE, weights, *OPENAI_TOKENIZER)}


def local(preset, backbone_cls):
    """`preset` itself, or the local folder of the Hub preset it names (`fetch` with `backbone_cls`'s conversion)."""
    if not is_hub(preset):
        storage.refuse_url(
            preset, "kgpt loads a preset from a local folder or hf://OWNER/REPO", "copy it here first", CheckpointError
        )
        return preset
    return fetch(preset, getattr(backbone_cls, "convert_openai_gpt", None))


def fetch(preset, convert):
    """The local folder of the preset `preset` names (`hf://...` or a named preset), downloaded as needed.

    `convert(source_dir, target_dir)` writes a kgpt preset from a folder of
    openai-gpt files; it runs once per commit, into a hidden folder renamed
    into place when whole, so an interrupted conversion is redone, never read.
    """
    plan = _plan(preset)
    if plan["ready"]:
        return plan["converted"]
    with _hub_errors(preset, plan["repo_id"], plan["revision"]):
        paths = {name: _download(plan["repo_id"], plan["commit"], name, sha) for name, sha in plan["wanted"].items()}
    snapshot = os.path.dirname(paths[CONFIG_FILE])
    if plan["layout"] == "kgpt":
        return snapshot
    if convert is None:
        raise CheckpointError(
            f"{preset} holds openai-gpt files, which kgpt converts for its GPT classes: load it "
            f"with kgpt.GPTBackbone, GPTTokenizer, GPTCausalLM or GPTTaskModel."
        )
    _convert_once(preset, snapshot, plan["converted"], convert, plan["commit"])
    return plan["converted"]


def check(preset):
    """What `fetch` would load, checked without downloading weights (for `--dry_run`).

    Returns `(description, folder)`: the folder holds the preset's configs
    and tokenizer files (the whole converted preset once converted), enough
    to tokenize with.
    """
    plan = _plan(preset)
    where = f"{preset} (commit {plan['commit'][:12]})"
    if plan["ready"]:
        return f"{where}: converted earlier, in {plan['converted']}", plan["converted"]
    small = {name: sha for name, sha in plan["wanted"].items() if not name.endswith(_WEIGHTS)}
    with _hub_errors(preset, plan["repo_id"], plan["revision"]):
        paths = {name: _download(plan["repo_id"], plan["commit"], name, sha) for name, sha in small.items()}
    weights = ", ".join(sorted(name for name in plan["wanted"] if name.endswith(_WEIGHTS)))
    kind = "a kgpt preset" if plan["layout"] == "kgpt" else "openai-gpt files"
    return (
        f"{where}: {kind} ({weights}), downloaded{' and converted' if kind != 'a kgpt preset' else ''} on first use"
    ), os.path.dirname(paths[CONFIG_FILE])


def _plan(preset):
    """The commit a Hub preset names, its layout and the files to read; only its config is downloaded."""
    from huggingface_hub import constants

    repo_id, revision = parse(preset)
    offline = constants.is_offline_mode()
    with _hub_errors(preset, repo_id, revision):
        try:
            commit, files = _commit_and_files(preset, repo_id, revision, offline)
        except Exception as e:  # a Hub that cannot be reached falls back to the cache, as huggingface_hub's own does
            if offline or not (_unreachable(e) or _server_error(e)):
                raise
            try:
                commit, files = _commit_and_files(preset, repo_id, revision, offline=True)
            except CheckpointError:
                raise e from None
            log.warning(
                f"{preset}: the Hub cannot be reached ({type(e).__name__}: {str(e).splitlines()[0][:80]}); "
                f"using the cached commit {commit[:12]}."
            )
        plan = {
            "repo_id": repo_id,
            "revision": revision,
            "commit": commit,
            "converted": os.path.join(_repo_cache(repo_id), commit),
        }
        plan["ready"] = os.path.isfile(os.path.join(plan["converted"], _READY))
        if plan["ready"]:
            return plan
        if files is not None and CONFIG_FILE not in files:
            raise CheckpointError(
                f"{preset} (commit {commit[:12]}) has no {CONFIG_FILE}: it holds no model kgpt "
                f"can load ({', '.join(sorted(files)[:8]) or 'no files'})."
            )
        config = _download(repo_id, commit, CONFIG_FILE)
        cached_only = files is None
        if cached_only:  # offline: the snapshot's cached files are all there is to read
            snapshot = os.path.dirname(config)
            files = {
                os.path.relpath(os.path.join(d, f), snapshot).replace(os.sep, "/"): None
                for d, _, names in os.walk(snapshot)
                for f in names
            }
        plan["layout"] = _layout(preset, config, files)
        plan["wanted"] = _kgpt_files(files) if plan["layout"] == "kgpt" else _openai_files(preset, files, cached_only)
    return plan


def _server_error(error):
    """An answer of the Hub's own failure (HTTP 5xx): like no answer, the cached commit stands in."""
    status = getattr(getattr(error, "response", None), "status_code", None)
    return isinstance(status, int) and status >= 500


def _unreachable(error):
    """A network failure, whichever HTTP client huggingface_hub runs on (httpx, httpx2 or requests)."""
    return bool(
        {c.__name__ for c in type(error).__mro__} & {"TransportError", "ConnectionError", "TimeoutError", "Timeout"}
    )


def _convert_once(preset, snapshot, converted, convert, commit):
    """Runs `convert` into a hidden sibling of `converted` named for this process, then renames it into place."""
    parent = os.path.dirname(converted)
    stem = f".{commit}.partial-"
    try:
        os.makedirs(parent, exist_ok=True)
        partial = tempfile.mkdtemp(prefix=f"{stem}{socket.gethostname()}-{os.getpid()}-", dir=parent)
    except OSError as e:
        raise CheckpointError(
            f"Cannot write the converted preset of {preset} under {parent} ({e.strerror}): set "
            f"KGPT_CACHE to a writable folder."
        ) from None
    for name in os.listdir(parent):  # what a killed conversion left
        if name.startswith(stem) and os.path.join(parent, name) != partial and _abandoned(name[len(stem) :]):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    try:
        log.info(f"Converting {preset} (commit {commit[:12]}) into a kgpt preset in {converted}")
        convert(snapshot, partial)
        with open(os.path.join(partial, _READY), "w", encoding="utf-8") as f:
            json.dump({"source": preset, "commit": commit}, f)
        if os.path.isdir(converted) and not os.path.isfile(os.path.join(converted, _READY)):
            log.warning(f"{converted} lacks its {_READY} (not whole, or edited): replacing it with this conversion.")
            shutil.rmtree(converted, ignore_errors=True)
        try:
            os.rename(partial, converted)
        except OSError:
            if not os.path.isfile(os.path.join(converted, _READY)):
                raise
            shutil.rmtree(partial, ignore_errors=True)  # another process converted the same commit first
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def _abandoned(owner):
    """Whether the process a partial conversion is named for (`HOST-PID-...`) is gone: on this host only."""
    match = re.fullmatch(r"(.+)-(\d+)-[^-]+", owner)
    if not match or match[1] != socket.gethostname():
        return False  # another host's (a shared cache): it removes its own
    try:
        os.kill(int(match[2]), 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass
    return False


def upload_preset(uri, preset_dir, private=None):
    """Uploads a local kgpt preset folder to `hf://OWNER/REPO` (created if needed), as keras-hub's `upload_preset`.

    The folder must hold a kgpt preset (its `config.json` names a kgpt
    class); its preset files (`UPLOADED`: configs, weights, tokenizer, and a
    run's `metrics.json`) go up as one commit, never a run's checkpoints,
    predictions or logs. Needs a token with write access
    (`hf auth login` or `HF_TOKEN`). `private=True` creates a new repository
    private (an existing one keeps its visibility). Returns the new commit's hash.

    Example:
    ```python
    kgpt.upload_preset("hf://me/my-sst2", "sst2_out")
    model = kgpt.GPTTaskModel.from_preset("hf://me/my-sst2")
    ```
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
    from huggingface_hub.utils import filter_repo_objects

    if not isinstance(uri, str) or not uri.startswith(PREFIX):
        raise CheckpointError(f"{uri!r}: upload to hf://OWNER/REPO.")
    repo_id, revision = parse(uri)
    folder = os.fspath(preset_dir)
    config = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(config):
        raise CheckpointError(
            f"{preset_dir} is not a kgpt preset folder (no {CONFIG_FILE}): save one with "
            f"save_to_preset or kgpt-train --output_dir first."
        )
    name = read_json(config, "a kgpt preset's config").get("registered_name", "")
    if not str(name).startswith("kgpt>"):
        raise CheckpointError(f"{config} describes {name!r}, not a kgpt model: upload_preset uploads kgpt presets.")
    if not os.path.isfile(os.path.join(folder, MODEL_WEIGHTS_FILE)):
        raise CheckpointError(
            f"{preset_dir} has no {MODEL_WEIGHTS_FILE}: a preset without its weights would load "
            f"as nothing; save it again with save_to_preset."
        )
    api = HfApi()
    local = [
        os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/")
        for d, _, names in os.walk(folder)
        for f in names
    ]
    local = sorted(filter_repo_objects(local, allow_patterns=UPLOADED, ignore_patterns=[f"{PARTIAL_DIR}/*"]))
    with _hub_errors(uri, repo_id, revision):
        repo_id = api.create_repo(repo_id, exist_ok=True, private=private).repo_id
        # An earlier upload's preset files that this preset lacks (a task.json over a backbone) go in the same
        # commit: the repository then holds one preset, never one preset's head on another's backbone.
        stale = sorted(
            set(filter_repo_objects(_repo_files(api, repo_id, revision), allow_patterns=UPLOADED)) - set(local)
        )
        operations = [CommitOperationAdd(name, os.path.join(folder, name)) for name in local]
        operations += [CommitOperationDelete(name) for name in stale]
        commit = api.create_commit(repo_id, operations, revision=revision, commit_message="Upload kgpt preset")
    if stale:
        log.info(f"{uri}: removed {len(stale)} file(s) of an earlier upload that this preset lacks: {', '.join(stale)}")
    return commit.oid


def _repo_files(api, repo_id, revision):
    """The files of the revision; none for a repository without commits, or a branch not made yet."""
    from huggingface_hub import errors

    try:
        return [s.rfilename for s in api.model_info(repo_id, revision=revision).siblings or []]
    except errors.RevisionNotFoundError:
        return []
