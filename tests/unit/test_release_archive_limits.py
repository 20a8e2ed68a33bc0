"""A release's recipes.tar.gz as an attacker would craft it: a gzip bomb in a member index.json does not
list, a member-count bomb, a huge listed member, links, devices, FIFOs, sparse files, `..` and absolute
names, control characters, PAX and GNU headers that declare (or are) huge. The whole archive is bounded
while it streams: the bomb tests count, by instrumenting zlib itself, how much was decompressed."""

from __future__ import annotations

import io
import tarfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from metralectl.core import release_archive as ra
from metralectl.errors import ExitCode, MetralError
from metralectl.names import UnsafeName
from tests.unit.release_fixture import fixture_recipes, reseal_index, sha, write_release

RECIPE = b'recipe_version: "2"\nmodel: x\n'
ENTRY = ra.IndexEntry("fam/one", "recipes/fam/one.yaml", sha(RECIPE), len(RECIPE))
INDEX = ra.ReleaseIndex("0" * 40, "", {}, [ENTRY])
MB = 1 << 20


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")


def _file(name: str, data: bytes) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return _header(info) + data + bytes(-len(data) % 512)


def _gz(raw: bytes) -> bytes:
    c = zlib.compressobj(6, zlib.DEFLATED, 31)
    return c.compress(raw) + c.flush()


def _archive(*members: bytes, listed: bool = True) -> bytes:
    """A gzip tar of raw member blocks, the listed recipe first."""
    return _gz((_file(ENTRY.path, RECIPE) if listed else b"") + b"".join(members) + bytes(1024))


def _special(name: str, kind: bytes, **fields: Any) -> bytes:
    info = tarfile.TarInfo(name)
    info.type = kind
    for key, value in fields.items():
        setattr(info, key, value)
    return _header(info)


def zero_bomb(prefix: bytes, zeros_mb: int, suffix: bytes = bytes(1024)) -> bytes:
    """A valid gzip stream of prefix + zeros_mb MB of zeros + suffix, built in milliseconds: after a full
    flush deflate starts afresh, so the compressed form of each 1 MB of zeros is the same bytes (~1 KB)."""
    zeros = bytes(MB)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    out = [c.compress(prefix) + c.flush(zlib.Z_FULL_FLUSH)]
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH) == block  # the trick holds
    out += [block] * zeros_mb
    out.append(c.compress(suffix) + c.flush(zlib.Z_FINISH))
    crc = zlib.crc32(prefix)
    for _ in range(zeros_mb):
        crc = zlib.crc32(zeros, crc)
    crc = zlib.crc32(suffix, crc)
    size = (len(prefix) + zeros_mb * MB + len(suffix)) & 0xFFFFFFFF
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    return header + b"".join(out) + crc.to_bytes(4, "little") + size.to_bytes(4, "little")


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """recipes.tar.gz with the listed recipe, then an unlisted member of 2 GB of zeros (~2 MB compressed)."""
    big = tarfile.TarInfo("recipes/notes.bin")
    big.size = 2048 * MB
    return zero_bomb(_file(ENTRY.path, RECIPE) + _header(big), 2048)


@pytest.fixture()
def inflated(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts every byte zlib decompresses in this test (whoever asks: tarfile's gzip or our reader)."""
    total = [0]
    real = zlib.decompressobj

    class Counting:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._real = real(*args, **kwargs)

        def decompress(self, data: bytes, max_length: int = 0) -> bytes:
            out = self._real.decompress(data, max_length)
            total[0] += len(out)
            return out

        def flush(self, *args: Any) -> bytes:
            out = self._real.flush(*args)
            total[0] += len(out)
            return out

        def __getattr__(self, name: str) -> Any:
            return getattr(self._real, name)

    monkeypatch.setattr(zlib, "decompressobj", Counting)
    yield total


def test_the_bomb_is_a_valid_archive_that_tarfile_would_unpack(bomb: bytes) -> None:
    assert len(bomb) < 3 * MB
    d = zlib.decompressobj(31)
    assert len(d.decompress(bomb[:64 << 10], 4 * MB)) == 4 * MB  # it inflates ~1000x


def test_a_gzip_bomb_in_an_unlisted_member_is_refused_before_it_is_decompressed(bomb: bytes,
                                                                                 inflated: list[int]) -> None:
    with pytest.raises(ra.ReleaseError, match=r"notes.bin declares 2147483648 bytes; the whole archive may unpack "
                                              r"to at most 64 MB") as caught:
        ra.read_recipes(bomb, INDEX)
    assert caught.value.exit_code == ExitCode.DATA
    assert inflated[0] <= ra.MAX_UNPACKED  # stopped at the header: nowhere near 2 GB


@pytest.mark.parametrize("kind", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME])
def test_a_header_that_is_itself_huge_stops_at_the_cap(kind: bytes, inflated: list[int]) -> None:
    """A PAX extended header (or GNU long name) of 256 MB: tarfile reads it in one call of its declared size,
    before any member is seen; the bounded stream ends that read at the cap."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = kind, 256 * MB
    archive = zero_bomb(_file(ENTRY.path, RECIPE) + _header(info), 256, _file("recipes/x", b"x") + bytes(1024))
    with pytest.raises(ra.ReleaseError, match="unpacks to more than 64 MB; it was not unpacked further"):
        ra.read_recipes(archive, INDEX)
    assert ra.MAX_UNPACKED < inflated[0] <= ra.MAX_UNPACKED + 2 * MB  # decompression stopped at the cap


def test_unlisted_members_count_toward_the_whole_archive(monkeypatch: pytest.MonkeyPatch, inflated: list[int]) -> None:
    """Many unlisted members, each small, together over the cap: the sum is what is bounded."""
    monkeypatch.setattr(ra, "MAX_UNPACKED", 4 * MB)
    archive = _archive(*(_file(f"recipes/pad/{i}.bin", bytes(MB)) for i in range(8)))
    with pytest.raises(ra.ReleaseError, match="the whole archive may unpack to at most 4 MB"):
        ra.read_recipes(archive, INDEX)
    assert inflated[0] <= 4 * MB


def test_a_pax_header_declaring_a_huge_size_is_refused_at_the_header(inflated: list[int]) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(ENTRY.path)
        info.size = len(RECIPE)
        tar.addfile(info, io.BytesIO(RECIPE))
        huge = tarfile.TarInfo("recipes/huge.bin")
        huge.pax_headers = {"size": str(10 ** 15)}
        tar.addfile(huge)
    with pytest.raises(ra.ReleaseError, match=f"huge.bin declares {10 ** 15} bytes"):
        ra.read_recipes(_gz(buffer.getvalue()), INDEX)
    assert inflated[0] < MB


def test_a_member_count_bomb_of_empty_directories_is_refused() -> None:
    dirs = [_special(f"recipes/d{i}", tarfile.DIRTYPE) for i in range(ra.MAX_MEMBERS + 10)]
    with pytest.raises(ra.ReleaseError, match=f"more than {ra.MAX_MEMBERS} entries"):
        ra.read_recipes(_archive(*dirs), INDEX)


def test_a_huge_listed_member_is_refused() -> None:
    entry = ra.IndexEntry("fam/big", "recipes/fam/big.yaml", "0" * 64, 10)
    index = ra.ReleaseIndex("0" * 40, "", {}, [ENTRY, entry])
    with pytest.raises(ra.ReleaseError, match=f"big.yaml is {2 * MB} bytes; a recipe is at most {ra.MAX_MEMBER}"):
        ra.read_recipes(_archive(_file(entry.path, bytes(2 * MB))), index)


@pytest.mark.parametrize("member", [
    _special("recipes/fam/hard.yaml", tarfile.LNKTYPE, linkname="recipes/fam/one.yaml"),
    _special("recipes/fam/sym.yaml", tarfile.SYMTYPE, linkname="/etc/shadow"),
    _special("recipes/fam/dev", tarfile.CHRTYPE, devmajor=1, devminor=5),
    _special("recipes/fam/blk", tarfile.BLKTYPE, devmajor=8, devminor=0),
    _special("recipes/fam/fifo", tarfile.FIFOTYPE),
], ids=["hard link", "symlink", "char device", "block device", "fifo"])
def test_links_devices_and_fifos_refuse_the_release(member: bytes) -> None:
    with pytest.raises(ra.ReleaseError, match="not a plain file"):
        ra.read_recipes(_archive(member), INDEX)


def test_a_sparse_member_is_refused_even_unlisted() -> None:
    """A GNU sparse file reads back as holes expanded to its real size: never a recipe."""
    with pytest.raises(ra.ReleaseError, match="not a plain file"):
        ra.read_recipes(_archive(_special("recipes/sparse.bin", tarfile.GNUTYPE_SPARSE)), INDEX)


@pytest.mark.parametrize("name", [
    "../../etc/cron.d/x", "recipes/../../x.yaml", "/etc/passwd", "recipes/fam/x\x1b]0;pwned\x07.yaml",
    "recipes/fam/line\nname: evil.yaml", "recipes/fam/\u202eyaml.exe", "recipes/fam/sp ace.yaml",
    "recipes//fam/x.yaml",
])
def test_unsafe_member_names_refuse_the_release_even_when_unlisted(name: str) -> None:
    with pytest.raises(UnsafeName, match="recipes.tar.gz gave a release path that is not one") as caught:
        ra.read_recipes(_archive(_file(name, b"x")), INDEX)
    assert caught.value.exit_code == ExitCode.DATA
    assert "\x1b" not in caught.value.message and "\n" not in caught.value.message


def test_a_listed_member_twice_is_refused() -> None:
    with pytest.raises(ra.ReleaseError, match="holds recipes/fam/one.yaml twice"):
        ra.read_recipes(_archive(_file(ENTRY.path, RECIPE)), INDEX)


def test_a_truncated_or_corrupt_stream_is_a_clear_refusal() -> None:
    good = _archive()
    for damaged in (good[: len(good) // 2], good[:20] + bytes(len(good) - 20), b"not gzip at all"):
        with pytest.raises(ra.ReleaseError, match="not a readable gzip tar archive"):
            ra.read_recipes(damaged, INDEX)


def test_a_well_formed_archive_still_reads(tmp_path: Path) -> None:
    extra = _special("recipes", tarfile.DIRTYPE) + _special(".", tarfile.DIRTYPE) + _file("recipes/README.md", b"hi")
    assert ra.read_recipes(_archive(extra), INDEX) == {"fam/one": RECIPE}


# --- the sync as a whole: a bomb refuses the release, nothing is installed ---------------------------------


def test_a_bomb_refuses_the_whole_sync(tmp_path: Path, isolated_env: Path, bomb: bytes) -> None:
    from metralectl.app import recipe_sync
    from metralectl.core import synced_set
    from metralectl.core.catalog import load_catalog
    from metralectl.seams.sync_fetch import Source

    recipes = fixture_recipes()
    files = b"".join(_file(f"recipes/{rid}.yaml", data) for rid, data in sorted(recipes.items()))
    big = tarfile.TarInfo("recipes/zzz/notes.bin")
    big.size = 2048 * MB
    release = write_release(tmp_path / "b40", recipes)
    (release / "recipes.tar.gz").write_bytes(zero_bomb(files + _header(big), 2048))
    reseal_index(release)
    root = synced_set.synced_dir()
    with pytest.raises(MetralError, match="declares 2147483648 bytes"):
        recipe_sync.sync(load_catalog(use_cache=False), Source(str(release)), root=root)
    assert not root.exists() or not (root / "current").exists()
