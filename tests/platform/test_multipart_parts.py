"""The multipart scanner in front of Django (platform_site/multipart_parts.py) sees the parts
Django's parser sees, with their sizes to the byte, however the body is cut into chunks:
well-formed bodies from real clients, and bodies crafted so that a stricter parser would see
other parts than Django (a boundary without its line break, LF-only lines, headers over
Django's room, a second Content-Disposition)."""

import io

import httpx
import pytest
from django.http.multipartparser import FIELD, FILE, ChunkIter, LazyStream, Parser

from platform_site.multipart_parts import PartOverLimit, PartScanner, boundary_of

B = b"x-b0undary-7"
CHUNKINGS = (1, 2, 7, 13, 64, 1000, 1 << 20)


def part(name: str, data: bytes, *, filename: str | None = "f", end: bytes = b"\r\n") -> bytes:
    file = f'; filename="{filename}"' if filename is not None else ""
    head = f'Content-Disposition: form-data; name="{name}"{file}\r\n'.encode()
    return b"--" + B + b"\r\n" + head + b"\r\n" + data + end


def closed(*parts: bytes) -> bytes:
    return b"".join(parts) + b"--" + B + b"--\r\n"


def django_parts(body: bytes, boundary: bytes = B) -> list[tuple[str, bool, int]]:
    """(name, is a file, bytes) of each part, as Django's own parser splits the body."""
    found = []
    for kind, meta, stream in Parser(LazyStream(ChunkIter(io.BytesIO(body), 64)), boundary):
        if kind not in (FILE, FIELD) or "name" not in meta["content-disposition"][1]:
            continue
        raw = meta["content-disposition"][1]["name"]
        name = (raw if isinstance(raw, bytes) else raw.encode()).strip().decode()
        found.append((name, kind == FILE, len(stream.read())))
    return found


def scan(body: bytes, files: dict[str, int], fields: int | None = None, chunk: int = 1 << 20):
    scanner = PartScanner(B, files, fields)
    for at in range(0, len(body), chunk):
        scanner.feed(body[at : at + chunk])
    scanner.finish()


def refused(body: bytes, files: dict[str, int], fields: int | None = None, chunk: int = 1 << 20):
    try:
        scan(body, files, fields, chunk)
    except PartOverLimit as over:
        return over.part.name
    return None


def assert_sizes_match_django(body: bytes) -> None:
    """Each file part passes at exactly its Django size and is refused one byte below it."""
    files = [(name, size) for name, is_file, size in django_parts(body) if is_file]
    assert files, "the body has file parts"
    for chunk in CHUNKINGS:
        for name, size in files:
            others = {n: 1 << 30 for n, _ in files if n != name}
            assert refused(body, {**others, name: size}, chunk=chunk) is None, (name, chunk)
            if size > 0:
                assert refused(body, {**others, name: size - 1}, chunk=chunk) == name


def test_a_real_clients_upload_passes_at_its_limits_and_not_a_byte_past():
    request = httpx.Request(
        "POST",
        "http://x/",
        files={
            "config": ("adapter_config.json", b'{"r": 8}'),
            "weights": ("adapter_model.safetensors", bytes(range(256)) * 40),
            "eval": ("eval.jsonl", b'{"prompt": "a", "completion": "b"}\n' * 3),
        },
    )
    body = request.read()
    boundary = boundary_of(request.headers["content-type"])
    assert boundary is not None
    sizes = {name: size for name, _, size in django_parts(body, boundary)}
    assert sizes == {"config": 8, "weights": 10240, "eval": 105}
    for chunk in CHUNKINGS:
        scanner = PartScanner(boundary, sizes, None)
        for at in range(0, len(body), chunk):
            scanner.feed(body[at : at + chunk])
        for name in sizes:
            with pytest.raises(PartOverLimit) as over:
                tight = PartScanner(boundary, {**sizes, name: sizes[name] - 1}, None)
                for at in range(0, len(body), chunk):
                    tight.feed(body[at : at + chunk])
            assert over.value.part.name == name


@pytest.mark.parametrize(
    "body",
    [
        closed(part("config", b"{}"), part("weights", b"W" * 3000), part("eval", b"E" * 500)),
        # the delimiter inside data, with no line break before it: Django starts a part there
        closed(part("weights", b"W" * 900, end=b""), part("config", b"C" * 2000)),
        # LF-only line breaks before the delimiters (Django strips a lone \n too)
        closed(part("weights", b"W" * 700, end=b"\n"), part("eval", b"E" * 300, end=b"\n")),
        # a preamble, and an epilogue after the close delimiter
        b"preamble\r\n" + closed(part("weights", b"W" * 100)) + b"epilogue" * 50,
        # data that ends in bytes the delimiter starts with
        closed(part("weights", b"W" * 10 + b"--" + B[:-1]), part("eval", b"-" * 40)),
        # a second Content-Disposition line: the last one names the part
        b"--" + B + b'\r\nContent-Disposition: form-data; name="eval"; filename="e"\r\n'
        b'Content-Disposition: form-data; name="weights"; filename="w"\r\n\r\n'
        + b"W" * 1500
        + b"\r\n--"
        + B
        + b"--\r\n",
    ],
    ids=["plain", "no-crlf", "lf-only", "preamble", "near-delimiter", "two-dispositions"],
)
def test_parts_and_sizes_are_djangos_whatever_the_chunks(body):
    assert_sizes_match_django(body)


def test_a_part_whose_headers_pass_djangos_room_is_not_counted_as_any_part():
    """Django refuses such a body itself (400); here it is no part's bytes."""
    long_header = b"X-Pad: " + b"p" * 1100 + b"\r\n"
    body = b"--" + B + b"\r\n" + long_header + b'Content-Disposition: form-data; name="eval"; '
    body += b'filename="e"\r\n\r\n' + b"E" * 5000 + b"\r\n--" + B + b"--\r\n"
    assert refused(body, {"eval": 10}) is None


def test_form_fields_count_together_as_django_counts_them():
    """Django's DATA_UPLOAD_MAX_MEMORY_SIZE: each value plus its name and two, summed."""
    body = closed(part("a", b"1" * 50, filename=None), part("bb", b"2" * 40, filename=None))
    total = 50 + 1 + 2 + 40 + 2 + 2
    assert refused(body, {}, fields=total) is None
    assert refused(body, {}, fields=total - 3) == "bb"


def test_a_base64_part_is_stopped_only_far_past_its_limit():
    """Django decodes it and holds the decoded bytes to the limit; 4/3 of them pass here."""
    head = b'Content-Disposition: form-data; name="eval"; filename="e"\r\n'
    body = b"--" + B + b"\r\n" + head + b"Content-Transfer-Encoding: base64\r\n\r\n"
    body += b"QUJD" * 40 + b"\r\n--" + B + b"--\r\n"  # 160 bytes, 120 decoded
    assert refused(body, {"eval": 120}) is None
    assert refused(body, {"eval": 70}) == "eval"


@pytest.mark.parametrize(
    "content_type",
    [
        "multipart/form-data",
        "multipart/form-data; boundary=",
        "multipart/form-data; boundary=" + "b" * 300,
        "multipart/form-data; boundary=caf\u00e9",
        "application/json; boundary=x",
    ],
)
def test_a_boundary_django_refuses_is_no_boundary_here(content_type):
    assert boundary_of(content_type) is None


def test_unknown_and_nameless_parts_count_only_against_the_whole_body():
    nameless = b"--" + B + b'\r\nContent-Disposition: form-data; filename="f"\r\n\r\n'
    body = closed(nameless + b"N" * 500 + b"\r\n", part("other", b"O" * 500))
    assert refused(body, {"weights": 1}) is None


def random_body(rng) -> bytes:
    """Pieces a hostile client might mix: delimiters with and without their line break,
    header blocks of every kind, data full of the delimiter's own bytes."""
    names = ["config", "weights", "eval", "note"]
    alphabet = [b"-", b"\r", b"\n", b"W", B[:3], b"--" + B[:-1], b"\r\n\r\n"]
    out = [b"junk" if rng.random() < 0.2 else b""]
    for _ in range(rng.randint(0, 5)):
        out.append(rng.choice([b"\r\n", b"\n", b"\r", b""]) + b"--" + B)
        out.append(rng.choice([b"\r\n", b"", b"--\r\n"]))
        name = rng.choice(names)
        file = rng.choice(['; filename="f"', "", '; filename=""'])
        header = f'Content-Disposition: form-data; name="{name}"{file}\r\n'.encode()
        if rng.random() < 0.2:
            header += b"Content-Type: application/octet-stream\r\n"
        out.append(rng.choice([header + b"\r\n", header, b"\r\n", b""]))
        out.append(b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))))
    out.append(rng.choice([b"\r\n--" + B + b"--\r\n", b"", b"\r\n--" + B]))
    return b"".join(out)


def test_random_hostile_bodies_split_as_django_splits_them():
    import random

    from django.http.multipartparser import MultiPartParserError

    rng = random.Random(20240611)
    checked = 0
    for _ in range(400):
        body = random_body(rng)
        try:
            parts = django_parts(body)
        except MultiPartParserError:
            continue
        files: dict[str, int] = {}
        fields = 0
        for name, is_file, size in parts:
            if is_file:
                files[name] = max(files.get(name, 0), size)
            else:
                fields += size + len(name) + 2
        chunk = rng.choice(CHUNKINGS)
        assert refused(body, files, fields, chunk) is None, body
        for name, size in files.items():
            if size:
                assert refused(body, {**files, name: size - 1}, None, chunk) == name, body
        if fields:
            assert refused(body, files, fields - 1, chunk) is not None, body
        checked += 1
    assert checked > 300
