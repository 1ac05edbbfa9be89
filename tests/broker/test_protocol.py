"""broker/protocol.py: the wire protocol's one table, and the documents broker/protocol_docs.py
generates from it."""

from __future__ import annotations

import re

import yaml

from broker import protocol_docs as protocol
from broker.protocol import CHANNELS, PARAMETERS, subject_of
from broker.protocol_docs import asyncapi
from broker.subjects import Subjects


def test_the_committed_documents_are_what_the_code_generates():
    stale = [str(path) for path, text in protocol.render().items() if path.read_text() != text]
    assert not stale, f"stale: {stale}; run python -m broker.protocol_docs"


def test_every_channel_is_a_subject_that_subjects_builds_and_parses():
    s = Subjects()
    ids = [c.id for c in CHANNELS]
    assert len(ids) == len(set(ids))
    for channel in CHANNELS:
        subject = subject_of(channel)
        assert subject.startswith("faas."), subject
        assert set(re.findall(r"\{(\w+)\}", subject)) <= set(PARAMETERS), subject
        assert not re.search(r"[A-Z]{3,}", subject.replace("{", "").replace("}", "")), f"placeholder left in {subject}"
    built = {c.id: c.build(s) for c in CHANNELS}
    for kind in ("request", "forward", "async"):
        call = s.parse_invocation(built[kind])
        assert (call.node, call.fn, call.client, call.request_id) == ("NODE", "FN", "CLIENT", "REQ")
    assert s.answer_ids(built["result"]) == ("result", "CLIENT", "REQ")
    assert s.answer_ids(built["reject"]) == ("reject", "CLIENT", "REQ")
    assert s.parse_learner(built["learner-act"]) == ("NODE", "MODEL", "act")
    assert s.parse_experience(built["reward"]) == ("NODE", None)
    assert s.parse_experience(built["experience"]) == ("NODE", "POOL")


def test_every_reference_of_the_asyncapi_document_resolves():
    document = asyncapi()
    assert yaml.safe_load(protocol.render()[protocol.DOCS / "asyncapi.yaml"]) == document

    def resolve(ref: str):
        node = document
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        return node

    refs = []

    def walk(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "$ref":
                    refs.append(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    assert len(refs) > len(CHANNELS)
    for ref in refs:
        assert ref.startswith("#/"), ref
        resolve(ref)   # KeyError names a reference to nothing
    assert set(document["operations"]) == set(document["channels"]) == {c.id for c in CHANNELS}


def test_a_stale_document_is_said(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(protocol, "DOCS", tmp_path)
    assert protocol.main(["--check"]) == 1
    assert "run python -m broker.protocol_docs" in capsys.readouterr().out
    assert protocol.main([]) == 0
    assert protocol.main(["--check"]) == 0
    (tmp_path / "protocol.md").write_text((tmp_path / "protocol.md").read_text() + "\nedited by hand\n")
    assert protocol.main(["--check"]) == 1
