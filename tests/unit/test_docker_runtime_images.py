"""An image's revision: the label its catalog entry names, else the first OCI label it carries (what `ps` and a
benchmark's target read, knowing no entry). tests/integration/test_demo_cpu.py checks it on a real image."""

from __future__ import annotations

from metralectl.seams.docker.images import IMAGE_REVISION_LABELS, image_revision
REVISION, VERSION = IMAGE_REVISION_LABELS


def test_a_named_label_is_read_and_nothing_else() -> None:
    labels = {REVISION: "abc123", VERSION: "11434.0.0"}
    assert image_revision(labels, VERSION) == "11434.0.0"
    assert image_revision(labels, REVISION) == "abc123"
    assert image_revision({VERSION: "11434.0.0"}, REVISION) is None  # named: no fallback to another label


def test_no_name_takes_the_source_revision_then_the_version() -> None:
    assert image_revision({REVISION: "abc123", VERSION: "1.0"}) == "abc123"
    assert image_revision({VERSION: "11434.0.0"}) == "11434.0.0"  # the llama.cpp images: a version, no revision
    assert image_revision({REVISION: "", VERSION: "2.0"}) == "2.0"  # an empty label says nothing
    assert image_revision({"org.opencontainers.image.title": "x"}) is None
    assert image_revision({}) is None
