"""Media validation pieces on real bytes: strict base64, magic bytes, header facts, checksums,
file confinement, address vetting (spec v2.5 §4.3, §4.5, §11.1)."""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import random
import socket
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from yarl import URL

from proxy.media.addresses import refusal
from proxy.media.decode import decode_strict
from proxy.media.facts import read_facts
from proxy.media.fetch import PinnedResolver, is_trusted, vet
from proxy.media.resolve import MediaRequest, NoBudget, prepare
from proxy.media.sniff import candidates, matches
from proxy.media.types import LIMITS, MediaError
from proxy.policy.model import MediaPolicy
from tests.media import samples

ALL = frozenset({"text", "image", "audio", "video", "document"})


def run(value: Any, module_dir: Path = Path(), accepted: frozenset[str] = ALL) -> Any:
    request = MediaRequest(module_dir, accepted, MediaPolicy(), time.monotonic() + 10, NoBudget())
    return asyncio.run(prepare(value, request))


def refused(value: Any, **kwargs: Any) -> MediaError:
    with pytest.raises(MediaError) as caught:
        run(value, **kwargs)
    return caught.value


def inline(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"images": [{"type": "base64", "media_type": media_type, "data": samples.b64(data), **extra}]}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("iVBO Rw==", "space"),
        ("iVBO\nRw==", "newline"),
        ("-_-_", "url-safe alphabet"),
        ("iVBORw", "no padding"),
        ("AA=A", "padding midway"),
        ("data:image/png;base64,iVBORw==", "data URL"),
        ("", "empty"),
        ("iVBORé==", "non-ASCII"),
    ],
)
def test_base64_is_decoded_strictly(text: str, why: str) -> None:
    with pytest.raises(MediaError) as caught:
        decode_strict(text, "input.images[0]", 1000)
    assert caught.value.code == "E1013", why


def test_base64_too_large_is_refused_from_its_length_before_decoding() -> None:
    text = "A" * (4 * 1024 * 1024)  # decodes to 3 MiB
    with pytest.raises(MediaError) as caught:
        decode_strict(text, "x", 1024 * 1024)
    assert caught.value.code == "E1011" and caught.value.details["size_bytes"] == 3 * 1024 * 1024


@pytest.mark.parametrize(
    ("media_type", "data"),
    [
        ("image/png", samples.PNG),
        ("image/jpeg", samples.JPEG),
        ("image/gif", samples.GIF),
        ("image/webp", samples.WEBP),
        ("audio/wav", samples.wav(0.1)),
        ("audio/mpeg", b"ID3\x03\x00\x00\x00\x00\x00\x00" + b"\x00" * 64),
        ("audio/ogg", b"OggS\x00\x02" + b"\x00" * 64),
        ("video/mp4", samples.mp4(3)),
        ("video/webm", b"\x1aE\xdf\xa3\x9fB\x86\x81\x01B\xf7\x81\x01B\xf2\x81\x04B\xf3\x81\x08B\x82\x84webm"),
        ("application/pdf", samples.pdf(2)),
    ],
)
def test_every_allowed_type_is_recognised_by_its_magic_bytes(media_type: str, data: bytes) -> None:
    assert matches(media_type, candidates(data)), candidates(data)


@pytest.mark.parametrize(
    ("declared", "data", "detected"),
    [
        ("image/png", samples.JPEG, "image/jpeg"),
        ("image/jpeg", samples.PNG, "image/png"),
        ("image/gif", samples.WEBP, "image/webp"),
        ("image/webp", samples.GIF, "image/gif"),
        ("image/png", samples.pdf(1), "application/pdf"),
        ("image/png", b"<svg xmlns='http://www.w3.org/2000/svg'></svg>", None),
        ("image/jpeg", b"MZ\x90\x00" + b"\x00" * 60, None),
    ],
)
def test_a_magic_byte_mismatch_is_e1014_with_the_detected_type(
    declared: str, data: bytes, detected: str | None
) -> None:
    error = refused(inline(declared, data))
    assert error.code == "E1014"
    assert error.details["declared_type"] == declared
    assert error.details["magic_bytes"] == data[:8].hex()
    if detected is not None:
        assert error.details["detected_type"] == detected


@pytest.mark.parametrize(
    "media_type", ["image/bmp", "image/svg+xml", "text/html", "application/zip", "image/tiff"]
)
def test_a_type_off_the_allowlist_is_e1010(media_type: str) -> None:
    assert refused(inline(media_type, samples.PNG)).code == "E1010"


def test_a_category_the_module_does_not_declare_is_e1010() -> None:
    error = refused(inline("application/pdf", samples.pdf(1)), accepted=frozenset({"text", "image"}))
    assert error.code == "E1010" and error.details["modalities"] == ["image", "text"]


@pytest.mark.parametrize(
    ("size", "code"),
    [
        ((8193, 100), "E1015"),
        ((100, 8193), "E1015"),
        ((9, 100), "E1016"),
        ((100, 9), "E1016"),
        ((8200, 8200), "E1017"),
        ((100_000, 100_000), "E1017"),
    ],
)
def test_image_bounds_come_from_the_header_alone(size: tuple[int, int], code: str) -> None:
    # A header claiming 10^10 pixels is refused without allocating them.
    error = refused(inline("image/png", samples.png_header(*size)))
    assert error.code == code


def test_image_facts_and_validation_meta() -> None:
    (media,) = run(inline("image/gif", samples.image("GIF", (40, 30))))
    assert media.validation() == {
        "index": 0,
        "path": "input.images[0]",
        "media_type": "image/gif",
        "size_bytes": media.size,
        "dimensions": {"width": 40, "height": 30},
        "color_mode": "P",
        "has_alpha": False,
        "valid": True,
    }


def test_durations_and_pages_are_read_and_bounded() -> None:
    assert read_facts(samples.wav(2.5), "audio/wav", "audio", "x").duration_ms == 2500
    assert read_facts(samples.mp4(42), "video/mp4", "video", "x").duration_ms == 42000
    assert read_facts(samples.pdf(3), "application/pdf", "document", "x").pages == 3
    with pytest.raises(MediaError) as long_video:
        read_facts(samples.mp4(301), "video/mp4", "video", "x")
    assert long_video.value.code == "E1011" and long_video.value.details["max_duration_ms"] == 300_000
    with pytest.raises(MediaError) as long_pdf:
        read_facts(samples.pdf(501), "application/pdf", "document", "x")
    assert long_pdf.value.code == "E1011" and long_pdf.value.details["pages"] == 501


@pytest.mark.parametrize(
    ("algorithm", "digest"),
    [
        ("sha256", lambda b: hashlib.sha256(b).hexdigest()),
        ("md5", lambda b: hashlib.md5(b).hexdigest()),
        ("crc32", lambda b: f"{zlib.crc32(b):08x}"),
    ],
)
def test_checksums_pass_when_right_and_are_e1001_when_wrong(algorithm: str, digest: Any) -> None:
    good = {"algorithm": algorithm, "value": digest(samples.PNG).upper()}
    (media,) = run(inline("image/png", samples.PNG, checksum=good))
    assert media.size == len(samples.PNG)
    bad = {"algorithm": algorithm, "value": digest(samples.JPEG)}
    error = refused(inline("image/png", samples.PNG, checksum=bad))
    assert error.code == "E1001" and error.details["reason"] == "checksum_mismatch"
    assert error.details["actual"] == digest(samples.PNG)


def test_a_file_outside_the_module_directory_is_refused(tmp_path: Path) -> None:
    module = tmp_path / "mod"
    (module / "media").mkdir(parents=True)
    (module / "media" / "ok.png").write_bytes(samples.PNG)
    (tmp_path / "secret.png").write_bytes(samples.PNG)
    (module / "media" / "link.png").symlink_to(tmp_path / "secret.png")
    (media,) = run({"i": {"type": "file", "path": "media/ok.png"}}, module)
    assert (media.media_type, media.source) == ("image/png", "ok.png")
    for path in (
        "../secret.png",
        str(tmp_path / "secret.png"),
        "media/link.png",
        "media/../../secret.png",
        "/etc/passwd",
    ):
        error = refused({"i": {"type": "file", "path": path}}, module_dir=module)
        assert error.code == "E1012", path
    assert refused({"i": {"type": "file", "path": "media/none.png"}}, module_dir=module).code == "E1012"


def test_a_file_over_its_category_limit_is_refused_before_reading(tmp_path: Path) -> None:
    big = tmp_path / "big.png"
    with big.open("wb") as handle:
        handle.write(samples.PNG)
        handle.truncate(LIMITS["image"].max_bytes + 1)  # sparse: nothing of it is read
    error = refused({"i": {"type": "file", "path": "big.png"}}, module_dir=tmp_path)
    assert error.code == "E1011" and error.details["size_bytes"] == LIMITS["image"].max_bytes + 1


def test_upload_ref_is_refused_as_not_supported() -> None:
    error = refused({"i": {"type": "upload_ref", "upload_id": "upl_abc123"}})
    assert error.code == "E4011" and error.details["form"] == "upload_ref"


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.9.9.9",
        "::1",
        "::ffff:127.0.0.1",
        "10.0.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "fd00:ec2::254",
        "100.100.100.200",
        "fe80::1",
        "fc00::1",
        "224.0.0.1",
        "ff02::1",
        "0.0.0.0",
        "::",
        "240.0.0.1",
        "100.64.0.1",
        "64:ff9b::a9fe:a9fe",
        "2002:a9fe:a9fe::1",
        "192.0.2.1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is not None


@pytest.mark.parametrize("address", ["93.184.215.14", "8.8.8.8", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


def test_the_fetch_resolver_answers_only_vetted_addresses_and_never_asks_dns() -> None:
    async def scenario() -> None:
        resolver = PinnedResolver()
        with pytest.raises(OSError, match="not vetted"):
            await resolver.resolve("example.com", 443)
        resolver.vetted["example.com"] = [(socket.AF_INET, "93.184.215.14")]
        (answer,) = await resolver.resolve("example.com", 443)
        assert (answer["host"], answer["hostname"], answer["port"]) == ("93.184.215.14", "example.com", 443)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("media_type", "category", "data"),
    [
        ("audio/wav", "audio", samples.wav(1.0)),
        ("video/mp4", "video", samples.mp4(3)),
        ("application/pdf", "document", samples.pdf(2)),
        ("image/png", "image", samples.PNG),
        ("image/jpeg", "image", samples.JPEG),
        ("image/gif", "image", samples.GIF),
        ("image/webp", "image", samples.WEBP),
    ],
)
def test_truncated_or_corrupted_headers_never_escape_as_exceptions(
    media_type: str, category: str, data: bytes
) -> None:
    rng = random.Random(17)
    for cut in range(min(len(data), 160)):
        corrupted = bytearray(data[:cut] + bytes(rng.randrange(256) for _ in range(rng.randrange(40))))
        try:
            read_facts(corrupted, media_type, category, "x")  # type: ignore[arg-type]
        except MediaError as exc:
            assert exc.code in {"E1013", "E1015", "E1016", "E1017", "E1011"}


@pytest.mark.parametrize(
    ("host", "port", "entries", "trusted"),
    [
        ("localhost", 8081, ("localhost:8081",), True),
        ("LOCALHOST.", 8081, ("localhost:8081",), True),
        ("localhost", 8082, ("localhost:8081",), False),  # another port of a trusted host
        ("localhost", 80, ("localhost",), True),  # a bare host: the default ports only
        ("localhost", 443, ("localhost",), True),
        ("localhost", 8081, ("localhost",), False),
        ("::1", 8081, ("[::1]:8081",), True),
        ("::1", 443, ("[::1]",), True),
        ("::1", 22, ("[::1]",), False),
        ("assets.internal", 8081, ("localhost:8081",), False),
        ("localhost", 8081, (), False),
    ],
)
def test_trusted_hosts_name_a_host_and_a_port(
    host: str, port: int, entries: tuple[str, ...], trusted: bool
) -> None:
    assert is_trusted(host, port, entries) is trusted


def test_a_trusted_host_on_another_port_is_vetted_like_any_host() -> None:
    settings = MediaPolicy(allow_http=True, trusted_hosts=("localhost:8081",))
    asyncio.run(vet(URL("http://localhost:8081/a.png"), settings))  # trusted: loopback allowed
    with pytest.raises(MediaError) as caught:
        asyncio.run(vet(URL("http://localhost:8082/a.png"), settings))
    assert caught.value.code == "E1012" and "Loopback" in caught.value.details["reason"]


def test_magic_bytes_are_echoed_for_inline_bytes_only(tmp_path: Path) -> None:
    """E1014 says what the client's own bytes start with, never a module file's (or a fetch's)."""
    (tmp_path / "secret.png").write_bytes(b"SECRET-KEY-MATERIAL")
    error = refused({"i": {"type": "file", "path": "secret.png"}}, module_dir=tmp_path)
    assert error.code == "E1014" and "magic_bytes" not in error.details
    assert refused(inline("image/png", b"SECRET-KEY-MATERIAL")).details["magic_bytes"] == b"SECRET-K".hex()


def test_every_path_that_is_not_a_module_file_gets_one_answer(tmp_path: Path) -> None:
    """Finding 7: no existence oracle. Outside the module directory, existing or not, through
    ``..``, an absolute path or a symlink (to a file that exists or not), a directory, a symlink
    loop: the same code, details and message (but for the client's own path)."""
    module = tmp_path / "mod"
    (module / "media").mkdir(parents=True)
    (tmp_path / "secret.png").write_bytes(samples.PNG)
    (module / "media" / "to-secret.png").symlink_to(tmp_path / "secret.png")
    (module / "media" / "to-nothing.png").symlink_to(tmp_path / "nothing.png")
    (module / "media" / "to-outside-dir").symlink_to(tmp_path)
    (module / "media" / "loop.png").symlink_to(module / "media" / "loop.png")
    paths = [
        "../secret.png", "../nothing.png", str(tmp_path / "secret.png"), str(tmp_path / "nothing.png"),
        "/etc/passwd", "/etc/no-such-file", "media/to-secret.png", "media/to-nothing.png",
        "media/to-outside-dir/secret.png", "media/to-outside-dir/nothing.png", "media/../../secret.png",
        "media/../../nothing.png", "media/loop.png", "media", "media/none.png", "/", "..",
    ]  # fmt: skip
    answers = set()
    for path in paths:
        error = refused({"i": {"type": "file", "path": path}}, module_dir=module)
        answers.add((error.code, error.message.replace(repr(path), "<path>"), tuple(error.details.items())))
    assert len(answers) == 1, answers


@pytest.mark.parametrize("fmt", ["BMP", "TIFF", "ICO", "PPM", "TGA"])
def test_pillow_reads_only_the_allowlisted_formats(fmt: str) -> None:
    """Images off the allowlist never reach another Pillow plugin's parser, whatever is declared."""
    with pytest.raises(MediaError) as caught:
        read_facts(samples.image(fmt), "image/png", "image", "x")
    assert caught.value.code == "E1013"
