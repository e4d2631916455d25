"""A small Hugging Face Hub on 127.0.0.1 for the tests: the requests `huggingface_hub` makes to read and write a model
repository, served from memory.

It answers what kgpt uses: repository info with its files (`/api/models/...`),
file downloads by branch, tag or commit (`/resolve/...`, HEAD and GET, ranges
for resumed downloads), repository creation and one-commit uploads of small
files (`preupload` + `commit`). Errors carry the Hub's `X-Error-Code` headers,
so `huggingface_hub` raises the same exceptions as against the real Hub. Every
request is recorded in `requests`, so a test can count them.
"""

import base64
import hashlib
import http.server
import io
import json
import re
import threading
import urllib.parse

import h5py
import numpy as np
from conftest import char_tokenizer
from safetensors.numpy import save as safetensors_bytes

LFS_SUFFIXES = (".safetensors", ".h5", ".bin", ".npy")
HEADS = 3  # the head count openai_gpt_files' config records
LAYER = [
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_1.weight",
    "ln_1.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
]


def torch_names(n_layer):
    return ["positions_embed.weight", "tokens_embed.weight"] + [f"h.{i}.{n}" for i in range(n_layer) for n in LAYER]


def openai_gpt_files(arrays, weights="safetensors"):
    """The files of an openai-gpt repository, as transformers writes them, from original-order arrays."""
    n_layer = (len(arrays) - 2) // 12
    tensors = {n: np.asarray(a[0] if a.ndim == 3 else a, "float32") for n, a in zip(torch_names(n_layer), arrays)}
    config = {
        "model_type": "openai-gpt",
        "architectures": ["OpenAIGPTLMHeadModel"],
        "n_layer": n_layer,
        "n_head": HEADS,
        "n_embd": arrays[1].shape[1],
        "n_positions": arrays[0].shape[0],
        "vocab_size": arrays[1].shape[0],
        "afn": "gelu",
    }
    encoder = {s: i for s, i in char_tokenizer().encoder.items() if not s.startswith("_")}
    files = {
        "config.json": json.dumps(config).encode(),
        "vocab.json": json.dumps(encoder).encode(),
        "merges.txt": b"#version: 0.2\n",
        "README.md": b"# GPT-1\n",
        "pytorch_model.bin": b"pickle, never read",
    }
    if weights == "safetensors":
        files["model.safetensors"] = safetensors_bytes({"transformer." + k: v for k, v in tensors.items()})
    elif weights == "tf":
        files["tf_model.h5"] = tf_h5_bytes(tensors)
    return files


def tf_h5_bytes(tensors):
    """transformers' TFOpenAIGPTLMHeadModel weights file: Keras h5 groups, `h_._N` blocks, [1, n] Conv1D biases."""
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as f:
        root = "transformer/tf_openai_gpt_lm_head_model/transformer/"
        for name, value in tensors.items():
            if name == "tokens_embed.weight":
                path = "tokens_embed/weight:0"
            elif name == "positions_embed.weight":
                path = "positions_embed/embeddings:0"
            else:
                _, layer, *rest, kind = name.split(".")
                if rest[0].startswith("ln"):
                    kind = {"weight": "gamma", "bias": "beta"}[kind]
                elif kind == "bias":
                    value = value[None]
                path = f"h_._{layer}/{'/'.join(rest)}/{kind}:0"
            f.create_dataset(root + path, data=value)
    return buffer.getvalue()


class _FailingError(Exception):
    pass


class FakeHub:
    """Repositories in memory, served over HTTP on 127.0.0.1 while the `with` block runs."""

    def __init__(self, token="hf_test_token"):
        self.token = token
        self.repos = {}  # repo_id -> {"private": bool, "refs": {name: sha}, "commits": {sha: {path: bytes}}}
        self.listed = {}  # (repo_id, path, bytes' sha1) -> what the listing says of the file, fixed when committed
        self.requests = []  # (method, path) of every request answered
        self.delay = 0.0  # seconds every answer waits (an unresponsive Hub)
        self.failing = None  # an HTTP status every request is answered with (a Hub failing on its side)
        self._server = None

    # --- content ---------------------------------------------------------------------------------------------------

    def commit(self, repo_id, files, branch="main", private=False, tag=None, deleted=()):
        """Adds a commit holding `files` ({path: bytes}) on top of `branch`, without the paths `deleted`; returns
        its 40-hex hash."""
        repo = self.repos.setdefault(repo_id, {"private": private, "refs": {}, "commits": {}})
        parent = repo["commits"].get(repo["refs"].get(branch), {})
        content = {name: data for name, data in {**parent, **files}.items() if name not in deleted}
        digest = hashlib.sha1(repr((repo_id, branch, len(repo["commits"]), sorted(content.items()))).encode())
        sha = digest.hexdigest()
        repo["commits"][sha] = content
        repo["refs"][branch] = sha
        for name, data in files.items():
            self.listed[repo_id, name, hashlib.sha1(data).hexdigest()] = self._sibling(name, data)
        if tag:
            repo["refs"][tag] = sha
        return sha

    def corrupt(self, repo_id, path, data):
        """Replaces a file's bytes in every commit without changing what the listing says of it (sha256, size)."""
        for files in self.repos[repo_id]["commits"].values():
            if path in files:
                self.listed[repo_id, path, hashlib.sha1(data).hexdigest()] = self.listed[
                    repo_id, path, hashlib.sha1(files[path]).hexdigest()
                ]
                files[path] = data

    def _listing(self, repo_id, name, data):
        return self.listed[repo_id, name, hashlib.sha1(data).hexdigest()]

    @property
    def url(self):
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def count(self, pattern):
        """How many recorded requests match `pattern` (a regular expression over "METHOD /path")."""
        return sum(bool(re.search(pattern, f"{m} {p}")) for m, p in self.requests)

    # --- serving ---------------------------------------------------------------------------------------------------

    def __enter__(self):
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._answer(self, "HEAD")

            def do_GET(self):
                hub._answer(self, "GET")

            def do_POST(self):
                hub._answer(self, "POST")

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    def _answer(self, handler, method):
        import time

        path = urllib.parse.urlsplit(handler.path).path
        self.requests.append((method, path))
        if self.delay:
            time.sleep(self.delay)
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0)) if method == "POST" else b""
        authorized = handler.headers.get("Authorization") == f"Bearer {self.token}"
        try:
            if self.failing:
                raise _FailingError()
            status, headers, payload = self._route(method, path, body, authorized, handler.headers.get("Range"))
        except _FailingError:
            status, headers, payload = self.failing, {}, {"error": "the Hub failed"}
        except KeyError as e:
            status, headers, payload = 404, {"X-Error-Code": str(e.args[0])}, {"error": str(e.args[0])}
        if not isinstance(payload, bytes):
            payload = json.dumps(payload).encode()
            headers = {"Content-Type": "application/json", **headers}
        handler.send_response(status)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", headers.get("Content-Length", str(len(payload))))
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(payload)

    def _repo(self, repo_id, authorized):
        repo = self.repos.get(repo_id)
        if repo is None or (repo["private"] and not authorized):
            raise KeyError("RepoNotFound")
        return repo

    def _resolve(self, repo, revision):
        revision = urllib.parse.unquote(revision or "main")
        if revision in repo["refs"]:
            return repo["refs"][revision]
        if revision in repo["commits"]:
            return revision
        raise KeyError("RevisionNotFound")

    def _route(self, method, path, body, authorized, byte_range):
        match = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if match and method == "GET":
            repo = self._repo(match[1], authorized)
            sha = self._resolve(repo, match[2])
            return (
                200,
                {},
                {
                    "id": match[1],
                    "modelId": match[1],
                    "sha": sha,
                    "private": repo["private"],
                    "siblings": [self._listing(match[1], name, data) for name, data in repo["commits"][sha].items()],
                },
            )
        match = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if match and method in ("GET", "HEAD"):
            repo = self._repo(match[1], authorized)
            sha = self._resolve(repo, match[2])
            files = repo["commits"][sha]
            name = urllib.parse.unquote(match[3])
            if name not in files:
                raise KeyError("EntryNotFound")
            data = files[name]
            etag = self._listing(match[1], name, data).get("lfs", {}).get("sha256") or hashlib.sha1(data).hexdigest()
            headers = {"X-Repo-Commit": sha, "ETag": f'"{etag}"', "Accept-Ranges": "bytes"}
            if method == "HEAD":
                return 200, {**headers, "Content-Length": str(len(data))}, b""
            if byte_range:
                start = int(re.fullmatch(r"bytes=(\d+)-\d*", byte_range)[1])
                return 206, {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}, data[start:]
            return 200, headers, data
        if path == "/api/repos/create" and method == "POST":
            if not authorized:
                return 401, {"X-Error-Code": "Unauthorized"}, {"error": "Invalid credentials"}
            request = json.loads(body)
            repo_id = f"{request.get('organization') or 'user'}/{request['name']}"
            answer = {"url": f"{self.url}/{repo_id}"}
            if repo_id in self.repos:
                return 409, {}, {**answer, "error": "You already created this model repo"}
            self.repos[repo_id] = {"private": request.get("visibility") == "private", "refs": {}, "commits": {}}
            return 200, {}, answer
        match = re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/([^/]+)", path)
        if match and method == "POST":
            self._repo(match[1], authorized)
            files = json.loads(body)["files"]
            return (
                200,
                {},
                {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]},
            )
        match = re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/([^/]+)", path)
        if match and method == "POST":
            if not authorized:
                return 401, {"X-Error-Code": "Unauthorized"}, {"error": "Invalid credentials"}
            self._repo(match[1], authorized)
            files, deleted = {}, set()
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                elif item["key"] == "deletedFile":
                    deleted.add(item["value"]["path"])
            sha = self.commit(match[1], files, branch=urllib.parse.unquote(match[2]), deleted=deleted)
            return (
                200,
                {},
                {"commitUrl": f"{self.url}/{match[1]}/commit/{sha}", "commitOid": sha, "pullRequestUrl": None},
            )
        return 404, {}, {"error": f"not served: {method} {path}"}

    @staticmethod
    def _sibling(name, data):
        sibling = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
        if name.endswith(LFS_SUFFIXES):
            sibling["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return sibling


def released_gpt1(hub):
    """Serves a tiny stand-in of the released GPT-1 (`gpt1_base_en`) on `hub`, in its repository's layout."""
    import gpt1_reference

    arrays = gpt1_reference.random_checkpoint(vocab=95, n_ctx=64, hidden=24, inner=96, n_layer=2)[1]
    return hub.commit("openai-community/openai-gpt", openai_gpt_files(arrays))


def environment(hub, folder):
    """The variables that point a new process's huggingface_hub and kgpt at `hub`, with caches in `folder`."""
    return {
        "HF_ENDPOINT": hub.url,
        "HF_HOME": f"{folder}/hf-home",
        "HF_HUB_CACHE": f"{folder}/hf-cache",
        "KGPT_CACHE": f"{folder}/kgpt-cache",
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
