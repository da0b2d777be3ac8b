"""Reads a bundle as untrusted input: a tar.gz, an extracted bundle directory, or a run directory (its
newest bundle). Members are read into memory, never extracted: only regular files with relative paths,
bounded in count and size; nothing is executed or unpickled. Imports the stdlib and blackbox only (and orjson, where
installed, to parse JSON faster: the stdlib's json decides whatever orjson refuses)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

from .._recorder import protocol as P
from ..detections import Trigger
from ..errors import BlackboxError
from . import layout as L
from .layout import MANIFEST, MANIFEST_SCHEMA_VERSION
from .writer import Written

_fast_loads: Optional[Callable[[bytes], Any]] = None
try:  # a 32,768-rank bundle holds 131,072 rank records: orjson parses them 3-4x faster than the stdlib's json
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - a dependency, but the report works without it
    pass

MAX_MEMBERS = 400_000  # 32,768 ranks with a dozen members each
MAX_MEMBER_BYTES = 64 * 1024 * 1024
MAX_TOTAL_BYTES = 256 * 1024 * 1024
# tables, lists and items one JSON member may hold: each costs ~60 bytes parsed, whatever its few bytes on disk
# (the manifest of a 32,768-rank node holds ~300,000)
MAX_JSON_ITEMS = 2_000_000


@dataclass
class Bundle:
    path: str
    manifest: dict[str, Any]
    files: dict[str, bytes]
    skipped: list[str]  # members refused (links, devices, unsafe paths), with the reason
    # the sha256 of each bundle file behind this view (of its manifest, for an extracted bundle directory)
    digests: dict[str, str] = field(default_factory=dict)
    _by_rank: Optional[dict[int, list[str]]] = field(default=None, repr=False)
    _parsed: dict[str, Any] = field(default_factory=dict, repr=False)

    # members every step of the analysis reads (each rank's heartbeat): parsed once, shared — never mutate them
    SHARED = ("/" + L.HEARTBEAT,)

    @classmethod
    def of(cls, written: Written) -> Bundle:
        """The bundle just written, as a reader of its file would see it, without reading the file."""
        files, skipped = dict(written.members), list[str]()
        expand_rank_table(files, skipped)
        return cls(written.path, written.manifest, files, skipped, {written.path: written.sha256})

    @property
    def trigger(self) -> Trigger:
        return Trigger.from_json(self.manifest.get("triggered_by"), self.manifest.get("trigger"))

    def json(self, name: str) -> Any:
        """The member parsed, or None when it is absent or not JSON a report can afford (see `parse_json`)."""
        if name in self._parsed:
            return self._parsed[name]
        data = self.files.get(name)
        if data is None:
            return None
        try:
            value = parse_json(data)
        except ValueError:
            value = None
        if name.endswith(self.SHARED):
            self._parsed[name] = value
        return value

    def text(self, name: str) -> str:
        return self.files.get(name, b"").decode("utf-8", "replace")

    def section(self, name: str) -> dict[str, Any]:
        """The manifest's table `name` (job, incident, multinode), or {} when absent or not a table: a bundle
        is untrusted input."""
        value = self.manifest.get(name)
        return value if isinstance(value, dict) else {}

    def local_ranks(self) -> list[dict[str, Any]]:
        """The manifest's job.local_ranks (each rank the node started: rank, pid, alive…): its tables only."""
        entries = self.section("job").get("local_ranks")
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def rank_files(self, rank: int) -> list[str]:
        """The members under ranks/<rank>/, sorted (an index built once: bundles may hold thousands of ranks)."""
        if self._by_rank is None:
            index: dict[int, list[str]] = {}
            for name in sorted(self.files):
                parts = name.split("/", 2)
                if len(parts) == 3 and parts[0] + "/" == L.RANKS_DIR and is_number(parts[1]):
                    index.setdefault(int(parts[1]), []).append(name)
            self._by_rank = index
        return self._by_rank.get(rank, [])

    def ranks(self) -> list[int]:
        self.rank_files(0)
        assert self._by_rank is not None
        return sorted(self._by_rank)


def is_number(text: str) -> bool:
    """ASCII digits only, and few enough to be a rank or a size (`str.isdigit` also admits `²`)."""
    return 0 < len(text) <= 18 and text.isascii() and text.isdigit()


def number(value: Any) -> Optional[float]:
    """A finite number from a bundle value: an int, a float or a numeric string; None for anything else (NaN,
    1e308, a list, `True`): every number a report computes with comes through here or `integer`."""
    if type(value) is float:  # the common case, answered first (a 32,768-rank report asks ~500,000 times)
        return value if -1e20 < value < 1e20 else None  # NaN compares false
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        out = float(value)
    except (ValueError, OverflowError):
        return None
    return out if math.isfinite(out) and abs(out) < 1e20 else None


def integer(value: Any) -> Optional[int]:
    """An integer from a bundle value: an int, or a string of ASCII digits; None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and is_number(value[1:] if value.startswith("-") else value):
        return int(value)
    return None


def expand_rank_table(files: dict[str, bytes], skipped: list[str]) -> None:
    """The rank table's records (`[R, "<name>", record]` a line) as the members ranks/R/<name> they stand for, each
    parsed only when read. Untrusted: a line of another shape, or a name that is not one of layout.TABLED, is left
    out and counted in `skipped`; a member the bundle also holds on its own is kept as it is."""
    table = files.pop(L.RANK_TABLE, None)  # its records stand in for it: kept once, not twice
    if not table:
        return
    bad = 0
    names = {name.encode(): "/" + name for name in L.TABLED}
    prefix = L.RANKS_DIR
    for line in table.split(b"\n"):
        head, sep, rest = line.partition(b'",')
        digits, _, name = head[1:].partition(b',"')
        tail = names.get(name)
        # bytes.isdigit is ASCII digits only; a rank has at most 9 of them
        if tail is None or not (sep and line[:1] == b"[" and rest[-1:] == b"]" and digits.isdigit()) or len(digits) > 9:
            bad += bool(line.strip())
            continue
        files.setdefault(prefix + str(int(digits)) + tail, rest[:-1])
    if bad:
        skipped.append(f"{L.RANK_TABLE}: {bad} line(s) that are not a rank's record")


def parse_json(data: bytes) -> Any:
    """JSON from a bundle. ValueError for what is not JSON, nests deeper than the parser's recursion, or holds
    more than MAX_JSON_ITEMS tables, lists and items (16 MB of `[{},{},…]` would take ~500 MB parsed)."""
    if len(data) > MAX_JSON_ITEMS and data.count(b",") + data.count(b"{") + data.count(b"[") > MAX_JSON_ITEMS:
        raise ValueError(f"more than {MAX_JSON_ITEMS} items")
    if _fast_loads is not None:
        try:
            return _fast_loads(data)
        except ValueError:  # NaN, an integer past 64 bits, a lone surrogate, deep nesting: as the stdlib says
            pass
    try:
        if len(data) > 1 and data[0] in b"{[" and data[1]:  # what json.loads would detect as UTF-8, without asking
            return json.loads(data.decode("utf-8", "surrogatepass"))
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _safe_name(name: str) -> bool:
    parts = name.replace("\\", "/").split("/")
    return bool(name) and not name.startswith("/") and ".." not in parts and "\0" not in name


def find_bundle(path: str) -> str:
    """A bundle file or directory from what the user named (a run directory gives its newest bundle)."""
    if not os.path.exists(path):
        raise BlackboxError(f"`{path}` does not exist.", hint="Give a bundle (.tar.gz), or a run directory.")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, MANIFEST)):
            return path
        bundles_dir = os.path.join(path, P.BUNDLES_DIR)
        found = []
        if os.path.isdir(bundles_dir):
            found = [os.path.join(bundles_dir, n) for n in os.listdir(bundles_dir) if n.endswith(".tar.gz")]
        if not found:
            raise BlackboxError(
                f"`{path}` holds no bundle: it is neither a bundle directory nor a run directory with bundles."
            )
        return max(found, key=os.path.getmtime)
    return path


def read_bundle(path: str) -> Bundle:
    path = find_bundle(path)
    files: dict[str, bytes] = {}
    skipped: list[str] = []
    if os.path.isdir(path):
        _read_dir(path, files, skipped)
        digest = hashlib.sha256(files.get(MANIFEST, b"")).hexdigest()  # it lists every member's
    else:
        digest = _read_tar(path, files, skipped)
    raw = files.get(MANIFEST)
    if raw is None:
        raise BlackboxError(f"`{path}` is not a blackbox bundle: it has no {MANIFEST}.")
    try:
        manifest = parse_json(raw)
    except ValueError as exc:
        raise BlackboxError(f"The manifest of `{path}` is not readable JSON ({str(exc)[:80]}).") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("schema_version"), int):
        raise BlackboxError(f"The manifest of `{path}` has no schema version.")
    if manifest["schema_version"] > MANIFEST_SCHEMA_VERSION:
        raise BlackboxError(
            f"`{path}` was written with bundle schema {manifest['schema_version']}, newer than this blackbox "
            f"reads ({MANIFEST_SCHEMA_VERSION}).",
            hint="Upgrade torch-blackbox to read it.",
        )
    expand_rank_table(files, skipped)
    return Bundle(path, manifest, files, skipped, {path: digest})


def _unpack(path: str) -> tuple[bytes, str]:
    """The archive's tar bytes, and the file's sha256: gunzipped in memory, in bounded steps, so that a gzip bomb is
    refused after reading at most the limit (tarfile's own gzip stream is also far slower on thousands of small
    members)."""
    limit = MAX_TOTAL_BYTES + MAX_MEMBERS * 1024  # the members' data, plus their headers and padding
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        if head != b"\x1f\x8b":
            data = f.read(limit + 1)
            digest.update(data)
        else:
            inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = bytearray()
            while not inflate.eof:
                chunk = inflate.unconsumed_tail
                if not chunk:
                    chunk = f.read(1 << 20)
                    digest.update(chunk)
                if not chunk:
                    raise BlackboxError(f"`{path}` is not a readable bundle (corrupt or truncated archive).")
                try:
                    out += inflate.decompress(chunk, limit + 1 - len(out))
                except zlib.error as exc:
                    raise BlackboxError(
                        f"`{path}` is not a readable bundle (corrupt or truncated archive: {exc})."
                    ) from None
                if len(out) > limit:
                    break
            data = bytes(out)
            for chunk in iter(lambda: f.read(1 << 20), b""):  # what follows the gzip stream is the file's too
                digest.update(chunk)
    if len(data) > limit:
        raise BlackboxError(f"`{path}` unpacks to more than {MAX_TOTAL_BYTES} bytes; refusing to read it.")
    return data, digest.hexdigest()


class _TarFormatError(Exception):
    pass


def _octal(field: bytes) -> int:
    """A header's number: octal digits, or GNU base-256 for large sizes. Never negative (a negative size would
    step the reader back onto the same header forever)."""
    if field and field[0] & 0x80:
        if field[0] & 0x40:
            raise _TarFormatError("a header field is negative")
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    if not text:
        return 0
    try:
        if not text.isdigit():  # ASCII digits only: no sign, no `²`
            raise ValueError
        return int(text, 8)
    except ValueError:
        raise _TarFormatError(f"a header field is not an octal number: {text[:20]!r}") from None


def _pax(data: bytes) -> dict[str, str]:
    """PAX extended-header records (`<len> key=value\n`): the ones that matter here are path and size."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            break
        digits = data[pos:space].decode("ascii", "replace")
        if not is_number(digits):
            raise _TarFormatError("a PAX record has no length")
        length = int(digits)
        if length <= space - pos or pos + length > len(data):
            raise _TarFormatError("a PAX record's length is out of bounds")
        key, _, value = data[space + 1 : pos + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        pos += length
    return out


def _members(data: bytes) -> Iterator[tuple[str, str, int, int]]:
    """(name, kind, offset, size) of each member of an uncompressed tar: a small reader of the ustar, PAX and GNU
    long-name formats, fast on thousands of small members and unable to create anything on disk."""
    pos, pending_name, pending_size = 0, None, None
    while pos + 512 <= len(data):
        header = data[pos : pos + 512]
        if header == bytes(512):
            return
        checksum = _octal(header[148:156])
        if checksum != sum(header[:148]) + 256 + sum(header[156:]):
            raise _TarFormatError("a header checksum does not match")
        kind = chr(header[156]) if header[156] else "0"
        size = _octal(header[124:136])
        start = pos + 512
        pos = start + (size + 511) // 512 * 512
        if start + size > len(data):
            raise _TarFormatError("a member runs past the end of the archive")
        if kind == "x":
            pax = _pax(data[start : start + size])
            pending_name = pax.get("path", pending_name)
            if "size" in pax:
                if not is_number(pax["size"]):
                    raise _TarFormatError(f"a PAX size is not a number: {pax['size'][:20]!r}")
                pending_size = int(pax["size"])
            continue
        if kind == "L":
            pending_name = data[start : start + size].split(b"\0", 1)[0].decode("utf-8", "replace")
            continue
        if kind == "g":
            continue
        name = pending_name
        if name is None:
            name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
            prefix = (
                header[345:500].split(b"\0", 1)[0].decode("utf-8", "replace") if header[257:262] == b"ustar" else ""
            )
            name = f"{prefix}/{name}" if prefix else name
        if pending_size is not None and kind in "07":
            size = pending_size
            pos = start + (size + 511) // 512 * 512
            if start + size > len(data):
                raise _TarFormatError("a member runs past the end of the archive")
        pending_name, pending_size = None, None
        yield name, kind, start, size


def _read_tar(path: str, files: dict[str, bytes], skipped: list[str]) -> str:
    """Reads the members into `files`; returns the file's sha256."""
    total = 0
    data, digest = _unpack(path)
    try:
        for count, (member, kind, offset, size) in enumerate(_members(data), 1):
            if count > MAX_MEMBERS:
                raise BlackboxError(f"`{path}` has more than {MAX_MEMBERS} members; refusing to read it.")
            if not _safe_name(member):
                skipped.append(f"{member}: unsafe path")
                continue
            if kind == "5":
                continue
            if kind not in "07":
                skipped.append(f"{member}: not a regular file")
                continue
            cap = MAX_TOTAL_BYTES if member == L.RANK_TABLE else MAX_MEMBER_BYTES  # a node's table holds all its ranks
            if size > cap:
                skipped.append(f"{member}: {size} bytes, over the {cap} byte limit")
                continue
            total += size
            if total > MAX_TOTAL_BYTES:
                raise BlackboxError(f"`{path}` unpacks to more than {MAX_TOTAL_BYTES} bytes; refusing to read it.")
            name = member[2:] if member.startswith("./") else member
            files[name] = data[offset : offset + size]
    except _TarFormatError as exc:
        raise BlackboxError(f"`{path}` is not a readable bundle (corrupt or truncated archive: {exc}).") from None
    return digest


def _read_dir(path: str, files: dict[str, bytes], skipped: list[str]) -> None:
    total = 0
    root = os.path.realpath(path)
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            if os.path.islink(full) or not os.path.isfile(full):
                skipped.append(f"{rel}: not a regular file")
                continue
            size = os.path.getsize(full)
            if size > (MAX_TOTAL_BYTES if rel == L.RANK_TABLE else MAX_MEMBER_BYTES) or len(files) >= MAX_MEMBERS:
                skipped.append(f"{rel}: over the size or count limit")
                continue
            total += size
            if total > MAX_TOTAL_BYTES:
                raise BlackboxError(f"`{path}` holds more than {MAX_TOTAL_BYTES} bytes; refusing to read it.")
            with open(full, "rb") as f:
                files[rel] = f.read()


def _expand(path: str) -> list[str]:
    """A directory that is neither a bundle nor a run directory but holds bundles (the node bundles of one
    incident, gathered in one place) stands for all of them."""
    if (
        os.path.isdir(path)
        and not os.path.isfile(os.path.join(path, MANIFEST))
        and not os.path.isdir(os.path.join(path, P.BUNDLES_DIR))
    ):
        found = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".tar.gz"))
        if found:
            return found
    return [path]


def _job_of(b: Bundle) -> str:
    """The job a bundle belongs to: a multi-node job's id (node 0's run id, shared through the coordinator),
    else the run id."""
    return str(b.section("multinode").get("job_id") or b.manifest.get("run_id"))


def expand_paths(paths: list[str]) -> list[str]:
    """The bundle files and directories the user's paths stand for."""
    return [p for path in paths for p in _expand(path)]


def read_bundles(paths: list[str]) -> Bundle:
    """One view of what the user named: a bundle, or the node bundles of one job merged by job id (each rank's
    files under ranks/<rank>/, each node's own files under nodes/<node>/). Bundles of different jobs are refused;
    of two bundles from the same node, the newest is used."""
    return merge_bundles([read_bundle(p) for p in expand_paths(paths)])


def merge_bundles(bundles: list[Bundle]) -> Bundle:
    """Bundles already read (from files, or fetched from shared storage) as one view: see `read_bundles`."""
    if len(bundles) == 1:
        return bundles[0]
    runs: dict[str, str] = {}
    for b in bundles:
        runs.setdefault(_job_of(b), b.path)
    if len(runs) > 1:
        (r1, p1), (r2, p2) = list(runs.items())[:2]
        raise BlackboxError(
            f"The bundles belong to different jobs: `{p1}` is job `{r1}`, `{p2}` is job `{r2}`.",
            hint="Give the bundles of one job (the same job or run id), one per node.",
        )
    by_node: dict[tuple[str, Any], Bundle] = {}
    skipped: list[str] = []
    for b in sorted(bundles, key=lambda b: str(b.manifest.get("created", ""))):
        key = (str(b.manifest.get("node", "unknown")), b.section("multinode").get("node_rank"))
        if key in by_node:
            skipped.append(f"{by_node[key].path}: an older bundle of node {key[0]}; the newest is used")
        by_node[key] = b
    incidents = sorted({str(b.section("incident").get("id")) for b in by_node.values() if b.section("incident")})
    if len(incidents) > 1:
        skipped.append(f"the bundles are of {len(incidents)} incidents ({', '.join(incidents)}): each node's newest "
                       "is used; give the bundles of one incident for one moment of the job")  # fmt: skip
    return merge(list(by_node.values()), skipped)


def _node_names(bundles: list[Bundle]) -> list[str]:
    """Each bundle's node name; nodes that share a host name (several nodes of one job on one machine) are told
    apart by their node rank."""
    hosts = [str(b.manifest.get("node", "unknown")) for b in bundles]
    ranks = [b.section("multinode").get("node_rank") for b in bundles]
    return [f"{h}-node{r}" if hosts.count(h) > 1 and r is not None else h for h, r in zip(hosts, ranks)]


def merge(bundles: list[Bundle], skipped: list[str]) -> Bundle:
    # The bundle of the node that saw the incident speaks for it (its trigger and detection), the others add ranks.
    def originated(b: Bundle) -> bool:
        origin = b.section("incident").get("origin")
        return origin is not None and str(origin) == str(b.section("multinode").get("node"))

    primary = next((b for b in bundles if originated(b) and L.DETECTION in b.files), None) or next(
        (b for b in bundles if L.DETECTION in b.files), bundles[0]
    )
    files: dict[str, bytes] = {}
    local_ranks: list[Any] = []
    nodes: list[dict[str, Any]] = []
    rank_nodes: dict[str, str] = {}  # rank -> the node whose bundle holds it
    digests: dict[str, str] = {}
    for b, node in zip(bundles, _node_names(bundles)):
        nodes.append({"node": node, "bundle": b.path, "trigger": b.manifest.get("trigger"),
                      "node_rank": b.section("multinode").get("node_rank"),
                      "incident": b.section("incident").get("id"),
                      "collection_started": b.section("collection").get("started")})  # fmt: skip
        for name, data in b.files.items():
            if L.is_per_rank(name):
                files[name] = data
            elif name != MANIFEST:
                files[L.node_member(node, name)] = data
        local_ranks.extend({**entry, "node": node} for entry in b.local_ranks())
        for name in b.files:
            if name.startswith(L.RANKS_DIR):
                rank_nodes[name.split("/")[1]] = node
        skipped.extend(b.skipped)
        digests.update(b.digests)
    for name, data in primary.files.items():
        if not L.is_per_rank(name) and name != MANIFEST:
            files[name] = data
    manifest = dict(primary.manifest)
    job = dict(primary.section("job"))
    worlds = [b.section("job").get("world_size") for b in bundles]
    job.update(local_ranks=local_ranks, world_size=max((w for w in worlds if isinstance(w, int)), default=0))
    manifest.update(node=", ".join(str(n["node"]) for n in nodes), job=job, nodes=nodes, rank_nodes=rank_nodes)
    return Bundle(" + ".join(b.path for b in bundles), manifest, files, skipped, digests)
