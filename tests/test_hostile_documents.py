"""Hostile input, class 1: untrusted documents of every kind, one table per kind.

provenance.json (read by release, reuse, verify-build, install, qualify), the
teacher file's meta, a server's answers (/v1/models, /tokenize, completions with
prompt_logprobs, streamed events, /metrics, /version), and model packs
(safetensors headers, the index, config.json). Every case must end in the
project's error naming the document and the field, with a `next:` step: never a
traceback, a MemoryError, a RecursionError, a hang, or `model check` exit 0.
Real parts: files written here, the CLI's own main(), a real HTTP server in a
thread (tests/hostile_server.py).
"""

from __future__ import annotations

import io
import json
import math
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hostile_server import Server, answer, endless, raw_headers
from pinwheel import untrusted
from pinwheel.checksums import sha256_file, write_sums
from pinwheel.cli import main
from pinwheel.errors import PinwheelError, UsageError, VerifyError
from pinwheel.serve.client import Client, ServerGone
from pinwheel.wheels.provenance import read_receipt
from releasekit import TREE, write_manifest, write_provenance
from wheelfactory import make_wheel

pytestmark = pytest.mark.timeout(120)

DEEP = b"[" * 100_000 + b"]" * 100_000  # RecursionError for a plain json.loads
GOOD_SHA = "a" * 64


def _flat(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- provenance.json


def _receipt(tmp_path: Path) -> Path:
    """A build directory with a real wheel, SHA256SUMS and a good provenance.json."""
    build = tmp_path / "wheels"
    build.mkdir()
    whl = make_wheel(build, {"demo/__init__.py": b"x = 1\n"}, tag="py3-none-any")
    write_sums(build, [whl.name])
    write_provenance(build, {whl.name: sha256_file(whl)})
    return build / "provenance.json"


def _edit(change: Callable[[dict[str, Any]], Any]) -> Callable[[bytes], bytes]:
    def apply(data: bytes) -> bytes:
        doc = json.loads(data)
        out = change(doc)
        return json.dumps(doc if out is None else out).encode()

    return apply


def _component(**kw: Any) -> dict[str, Any]:
    base = {"name": "engine", "kind": "engine", "wheel": "demo-1.0-py3-none-any.whl"}
    return {**base, "sha256": GOOD_SHA, **kw}


# case -> (how the good receipt is damaged, what the message must name)
PROVENANCE: dict[str, tuple[Callable[[bytes], bytes], str]] = {
    "a list, not an object": (lambda d: b"[1, 2]", "expected an object"),
    "a string, not an object": (lambda d: b'"receipt"', "expected an object"),
    "schema missing": (_edit(lambda d: d.pop("schema") and None), "field schema"),
    "schema a number": (_edit(lambda d: d.update(schema=1)), "field schema"),
    "not UTF-8": (lambda d: d.replace(b"kit-20261010", b"kit-\xff\xfe"), "not UTF-8"),
    "not JSON": (lambda d: d[:-5], "not JSON"),
    "NaN in it": (lambda d: d.replace(b"1791590400", b"NaN"), "not JSON"),
    "nested 100000 deep": (lambda d: d[:-2] + b', "x": ' + DEEP + b"}", "nested more than"),
    "17 MiB": (lambda d: d[:-2] + b', "pad": "' + b"x" * (17 << 20) + b'"}', "more than"),
    "wheels a list": (_edit(lambda d: d.update(wheels=["a"])), "field wheels"),
    "wheels digest a number": (
        _edit(lambda d: d.update(wheels={"demo-1.0-py3-none-any.whl": 5})),
        "field wheels.demo-1.0-py3-none-any.whl",
    ),
    "wheels digest not hex": (
        _edit(lambda d: d.update(wheels={"demo-1.0-py3-none-any.whl": "zz"})),
        "not 64 lowercase hex",
    ),
    "components an object": (_edit(lambda d: d.update(components={})), "field components"),
    "component a string": (_edit(lambda d: d.update(components=["x"])), "field components[0]"),
    "component without sha256": (
        _edit(lambda d: d.update(components=[{"name": "e", "kind": "engine", "wheel": "a.whl"}])),
        "field components[0].sha256",
    ),
    "component sha256 a list": (
        _edit(lambda d: d.update(components=[_component(sha256=[1])])),
        "field components[0].sha256",
    ),
    "component wheel a path": (
        _edit(lambda d: d.update(components=[_component(wheel="../../etc/x.whl")])),
        "not a wheel file name",
    ),
    "component source a string": (
        _edit(lambda d: d.update(components=[_component(source="tree")])),
        "field components[0].source",
    ),
    "component epoch a string": (
        _edit(lambda d: d.update(components=[_component(source_date_epoch="1")])),
        "field components[0].source_date_epoch",
    ),
    "tree a number": (_edit(lambda d: d.update(tree=7)), "field tree"),
    "tag a list": (_edit(lambda d: d.update(tag=["a"])), "field tag"),
    "arches a string": (_edit(lambda d: d.update(arches="sm_70")), "field arches"),
    "torch a string": (_edit(lambda d: d.update(torch="2.9")), "field torch"),
    "torch version a number": (_edit(lambda d: d.update(torch={"version": 2.9})), "torch.version"),
    "manifest sha256 missing": (
        _edit(lambda d: d.update(manifest={"name": "kit"})),
        "field manifest.sha256",
    ),
    "steps an object": (_edit(lambda d: d.update(steps={"1": {}})), "field steps"),
    "a directory": (lambda d: b"", "is a directory"),
}


def _damage(tmp_path: Path, case: str) -> Path:
    path = _receipt(tmp_path)
    change, _ = PROVENANCE[case]
    if case == "a directory":
        path.unlink()
        path.mkdir()
    else:
        path.write_bytes(change(path.read_bytes()))
    return path


@pytest.mark.parametrize("case", sorted(PROVENANCE))
def test_a_damaged_receipt_is_a_verify_error_naming_the_field(case, tmp_path):
    path = _damage(tmp_path, case)
    with pytest.raises(VerifyError) as err:
        read_receipt(path)
    text = _flat(str(err.value))
    assert "provenance.json" in text and PROVENANCE[case][1] in text, text
    assert err.value.next and str(path) in (err.value.where or "")


def test_the_good_receipt_reads(tmp_path):
    receipt = read_receipt(_receipt(tmp_path))
    assert receipt.tree == TREE and receipt["tree"] == TREE  # typed, and every key as written


@pytest.mark.parametrize(
    "case", ["a list, not an object", "wheels a list", "nested 100000 deep", "not UTF-8"]
)
def test_release_reuse_and_install_say_so_too(case, tmp_path, capsys):
    path = _damage(tmp_path, case)
    manifest = write_manifest(tmp_path)
    rc = main(["--manifest", str(manifest), "release", "--from", str(path.parent), "--no-sign"]
              + ["--out", str(tmp_path / "rel")])  # fmt: skip
    err = _flat(capsys.readouterr().err)
    assert rc == 6 and "provenance.json" in err and "next:" in err and "Traceback" not in err
    assert not (tmp_path / "rel").exists()

    from pinwheel.compile.reuse import candidates

    with pytest.raises(VerifyError, match="provenance.json"):
        candidates(str(path.parent), tmp_path / "cache")

    from pinwheel.checksums import sha256_file
    from pinwheel.release.install import torch_pin

    # install reads a provenance only as the verified SHA256SUMS lists it (issue 20)
    with pytest.raises(VerifyError, match="provenance.json"):
        torch_pin(path.parent, {"provenance.json": sha256_file(path)})


# --------------------------------------------------------------------------- teacher file


def _teacher(meta: Any, arrays: dict[str, Any] | None = None) -> bytes:
    import numpy as np

    from pinwheel.serve import fidelity

    arrays = arrays or {
        "offsets": np.array([0, 2, 4], np.int64),
        "target": np.array([1, 2, 3, 4], np.int32),
        "target_logprob": np.full(4, -1.0, np.float32),
        "top_ids": np.zeros((4, 2), np.int32),
        "top_logprobs": np.full((4, 2), -1.0, np.float32),
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, value in arrays.items():
            one = io.BytesIO()
            np.lib.format.write_array(one, value, allow_pickle=False)
            zf.writestr(name + ".npy", one.getvalue())
        raw = meta if isinstance(meta, bytes) else json.dumps(meta).encode()
        one = io.BytesIO()
        np.lib.format.write_array(one, np.frombuffer(raw, np.uint8), allow_pickle=False)
        zf.writestr("meta.npy", one.getvalue())
    assert fidelity.TEACHER_SCHEMA == "pinwheel.teacher/1"
    return buf.getvalue()


GOOD_META = {"schema": "pinwheel.teacher/1", "panel_sha256": GOOD_SHA, "source": "t", "top_k": 2}

TEACHER_META: dict[str, tuple[Any, str]] = {
    "a list": ([1, 2], "not a pinwheel.teacher/1 file"),
    "schema missing": ({"panel_sha256": GOOD_SHA}, "not a pinwheel.teacher/1 file"),
    "panel_sha256 missing": ({"schema": "pinwheel.teacher/1"}, "field panel_sha256"),
    "panel_sha256 a number": ({**GOOD_META, "panel_sha256": 7}, "field panel_sha256"),
    "panel_sha256 not hex": ({**GOOD_META, "panel_sha256": "x" * 64}, "not 64 lowercase hex"),
    "top_k a string": ({**GOOD_META, "top_k": "2"}, "field top_k"),
    "top_k zero": ({**GOOD_META, "top_k": 0}, "neither -1"),
    "source a list": ({**GOOD_META, "source": ["a"]}, "field source"),
    "not UTF-8": (b'{"schema": "\xff"}', "not UTF-8"),
    "nested 100000 deep": (DEEP, "nested more than"),
    "2 MiB": (b'"' + b"x" * (2 << 20) + b'"', "more than"),
}


@pytest.mark.parametrize("case", sorted(TEACHER_META))
def test_a_bad_teacher_meta_is_a_usage_error_naming_the_field(case):
    from pinwheel.serve.fidelity import load_teacher

    meta, gist = TEACHER_META[case]
    with pytest.raises(UsageError) as err:
        load_teacher(_teacher(meta), "teacher.npz")
    text = _flat(str(err.value))
    assert gist in text and err.value.next, text


def test_a_teacher_on_the_same_panel_sha_but_other_windows_says_so():
    import numpy as np

    from pinwheel.errors import VerifyError
    from pinwheel.serve.fidelity import Panel, _check_panel, load_teacher

    teacher = load_teacher(_teacher(GOOD_META), "t.npz")  # offsets [0, 2, 4]
    panel = Panel(((1, 2, 3, 4, 5),), GOOD_SHA, "panel.json")  # one window of 4 positions
    with pytest.raises(VerifyError) as err:
        _check_panel(teacher, panel)
    assert "its windows differ" in err.value.what and f"not {GOOD_SHA}" not in err.value.what
    assert np.array_equal(teacher.offsets, [0, 2, 4])


def test_a_good_teacher_loads():
    from pinwheel.serve.fidelity import load_teacher

    assert load_teacher(_teacher(GOOD_META), "t").positions == 4


# --------------------------------------------------------------------------- fidelity panel

PANEL: dict[str, tuple[bytes, str]] = {
    "a list": (b"[[1, 2]]", "schema is not"),
    "windows an object": (b'{"schema": "pinwheel.panel/1", "windows": {"a": 1}}', "field windows"),
    "a window of strings": (b'{"schema": "pinwheel.panel/1", "windows": [["1", "2"]]}', "field windows[0][0]"),
    "texts a number": (b'{"schema": "pinwheel.panel/1", "texts": 5}', "field texts"),
    "window a string": (b'{"schema": "pinwheel.panel/1", "texts": ["a"], "window": "8"}', "field window"),
    "neither windows nor texts": (b'{"schema": "pinwheel.panel/1"}', "neither windows nor texts"),
    "not UTF-8": (b'{"schema": "pinwheel.panel/1", "texts": ["\xff"]}', "not UTF-8"),
    "nested deep": (b'{"schema": "pinwheel.panel/1", "windows": ' + b"[" * 20 + b"]" * 20 + b"}", "nested more than"),
    "not JSON": (b'{"schema": ', "not JSON"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(PANEL))
def test_a_bad_panel_is_a_usage_error_naming_the_field(case, tmp_path):
    from pinwheel.serve.fidelity import read_panel

    path = tmp_path / "panel.json"
    body, gist = PANEL[case]
    path.write_bytes(body)
    with pytest.raises(UsageError) as err:
        read_panel(path, None, lambda text: [1, 2, 3])
    assert gist in _flat(str(err.value)) and err.value.next, str(err.value)


# --------------------------------------------------------------------------- server answers


def _models(body: bytes) -> dict[str, Any]:
    return {"/v1/models": answer(body)}


# case -> (routes, call, what the message must say)
SERVER: dict[str, tuple[dict[str, Any], Callable[[Client], Any], str]] = {
    "models: a list": (_models(b"[]"), Client.models, "expected an object"),
    "models: data an object": (_models(b'{"data": {}}'), Client.models, "field data"),
    "models: id a number": (_models(b'{"data": [{"id": 5}]}'), Client.models, "field data[0].id"),
    "models: entry a string": (_models(b'{"data": ["m"]}'), Client.models, "field data[0]"),
    "models: no data": (_models(b"{}"), Client.models, "field data: missing"),
    "models: entry without id": (_models(b'{"data": [{"object": "model"}]}'), Client.models,
                                 "field data[0].id: missing"),
    "models: Infinity": (_models(b'{"data": Infinity}'), Client.models, "not JSON"),
    "models: empty": (_models(b'{"data": []}'), Client.models, "lists no model"),
    "models: not UTF-8": (_models(b'{"data": [{"id": "\xff"}]}'), Client.models, "not UTF-8"),
    "models: not JSON": (_models(b"<html>"), Client.models, "not JSON"),
    "models: NaN": (_models(b'{"data": NaN}'), Client.models, "not JSON"),
    "models: nested deep": (_models(DEEP), Client.models, "nested more than"),
    "models: 65 MiB announced": (
        {"/v1/models": raw_headers([("Content-Length", str(65 << 20))])},
        Client.models,
        "more than the",
    ),
    "models: Content-Length abc": (
        {"/v1/models": raw_headers([("Content-Length", "abc")], b"{}")},
        Client.models,
        "Content-Length",
    ),
    "models: endless body": ({"/v1/models": endless(b"x" * 65536)}, Client.models, "more than"),
    "tokenize: tokens strings": (
        {"/tokenize": answer(b'{"tokens": ["1", "2"]}')},
        lambda c: c.tokenize("m", prompt="hi"),
        "field tokens[0]",
    ),
    "tokenize: negative id": (
        {"/tokenize": answer(b'{"tokens": [1, -2]}')},
        lambda c: c.tokenize("m", prompt="hi"),
        "negative",
    ),
    "tokenize: no tokens": (
        {"/tokenize": answer(b'{"count": 2}')},
        lambda c: c.tokenize("m", prompt="hi"),
        "field tokens: missing",
    ),
    "completion: no choices": (
        {"/v1/completions": answer(b'{"usage": {}}')},
        lambda c: c.complete("m", [1], 4),
        "field choices: missing",
    ),
    "completion: text a number": (
        {"/v1/completions": answer(b'{"choices": [{"text": 5}]}')},
        lambda c: c.complete("m", [1], 4),
        "field choices[0].text",
    ),
    "completion: choices empty": (
        {"/v1/completions": answer(b'{"choices": []}')},
        lambda c: c.complete("m", [1], 4),
        "choices is empty",
    ),
    "completion: usage a string": (
        {"/v1/completions": answer(b'{"choices": [{"text": "x"}], "usage": "7"}')},
        lambda c: c.complete("m", [1], 4),
        "field usage",
    ),
    "completion: token count a float string": (
        {"/v1/completions": answer(b'{"choices": [{}], "usage": {"prompt_tokens": "3"}}')},
        lambda c: c.complete("m", [1], 4),
        "field usage.prompt_tokens",
    ),
    "logprobs: key not a token id": (
        {"/v1/completions": answer(b'{"choices": [{"prompt_logprobs": [null, {"x": {"logprob": -1}}]}]}')},
        lambda c: c.prompt_logprobs("m", [1, 2], 1),
        "is not a token id",
    ),
    "logprobs: logprob a string": (
        {"/v1/completions": answer(b'{"choices": [{"prompt_logprobs": [null, {"5": {"logprob": "-1"}}]}]}')},
        lambda c: c.prompt_logprobs("m", [1, 2], 1),
        "prompt_logprobs[1].5.logprob",
    ),
    "logprobs: logprob above 0": (
        {"/v1/completions": answer(b'{"choices": [{"prompt_logprobs": [null, {"5": {"logprob": 3.0}}]}]}')},
        lambda c: c.prompt_logprobs("m", [1, 2], 1),
        "above 0",
    ),
    "logprobs: entry a list": (
        {"/v1/completions": answer(b'{"choices": [{"prompt_logprobs": [null, [1, 2]]}]}')},
        lambda c: c.prompt_logprobs("m", [1, 2], 1),
        "prompt_logprobs[1]",
    ),
    "logprobs: 2 GiB announced": (
        {"/v1/completions": raw_headers([("Content-Length", str(2 << 30))])},
        lambda c: c.prompt_logprobs("m", [1, 2], 1),
        "more than the",
    ),
    "stream: event a list": (
        {"/v1/chat/completions": answer(b"data: [1]\n\ndata: [DONE]\n\n", ctype="text/event-stream")},
        lambda c: c.stream_chat("m", "hi", 4),
        "stream event",
    ),
    "stream: delta a string": (
        {"/v1/chat/completions": answer(b'data: {"choices": [{"delta": "x"}]}\n\n', ctype="text/event-stream")},
        lambda c: c.stream_chat("m", "hi", 4),
        "field choices[0].delta",
    ),
    "stream: usage tokens a string": (
        {"/v1/chat/completions": answer(b'data: {"choices": [], "usage": {"completion_tokens": "9"}}\n\n', ctype="text/event-stream")},
        lambda c: c.stream_chat("m", "hi", 4),
        "usage.completion_tokens",
    ),
    "stream: one endless line": (
        {"/v1/chat/completions": endless(b"data: " + b"x" * 65536)},
        lambda c: c.stream_chat("m", "hi", 4),
        "a line longer than",
    ),
    "stream: event not UTF-8": (
        {"/v1/chat/completions": answer(b'data: {"choices": [{"text": "\xff"}]}\n\n', ctype="text/event-stream")},
        lambda c: c.stream_chat("m", "hi", 4),
        "not UTF-8",
    ),
    "stream: event nested deep": (
        {"/v1/chat/completions": answer(b"data: " + b"[" * 5000 + b"\n\n", ctype="text/event-stream")},
        lambda c: c.stream_chat("m", "hi", 4),
        "nested more than",
    ),
    "metrics: not UTF-8": ({"/metrics": answer(b"vllm:x 1\n\xff\n", ctype="text/plain")}, Client.metrics, "not UTF-8"),
    "metrics: endless": ({"/metrics": endless(b"vllm:x 1\n" * 4096)}, Client.metrics, "more than"),
    "version: a number": ({"/version": answer(b'{"version": 1}')}, Client.version, "field version"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SERVER))
def test_a_bad_server_answer_is_a_clean_error_naming_the_field(case):
    routes, call, gist = SERVER[case]
    with Server(routes) as srv:
        client = Client(srv.url, timeout=10, deadline=20)
        try:
            with pytest.raises(PinwheelError) as err:
                call(client)
        finally:
            client.close()
    text = _flat(str(err.value))
    assert gist in text and err.value.next, text
    assert srv.url in (err.value.where or "")


def test_a_stream_that_never_sends_done_ends_at_the_deadline():
    event = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'
    with Server({"/v1/chat/completions": endless(event, pause=0.05)}) as srv:
        client = Client(srv.url, timeout=10, deadline=1.5)
        with pytest.raises(ServerGone) as err:
            client.stream_chat("m", "hi", 4)
        client.close()
    assert "deadline" in err.value.what and err.value.next


def test_a_trickled_answer_ends_at_the_deadline_though_no_read_stalls():
    with Server({"/v1/models": endless(b" ", pause=0.1)}) as srv:
        client = Client(srv.url, timeout=5, deadline=1.0)
        with pytest.raises(ServerGone, match="deadline"):
            client.models()
        client.close()


def test_a_server_gone_silent_mid_answer_ends_at_the_deadline_not_the_stall_timeout():
    # One byte, then silence far longer than the suite's timeout: only a read bounded by
    # the deadline (not the 600 s stall timeout) lets this test finish.
    with Server({"/v1/models": endless(b" ", pause=1000, limit=1)}) as srv:
        client = Client(srv.url, timeout=600, deadline=1.0)
        with pytest.raises(ServerGone, match="deadline"):
            client.models()
        client.close()


def test_metrics_with_timestamps_and_labels_with_spaces_parse():
    body = (
        b'# HELP x\nvllm:a_total{model_name="my model"} 3 1712000000000\n'
        b"vllm:b 2.5\nvllm:c NaN\nbroken line here\n"
    )
    with Server({"/metrics": answer(body, ctype="text/plain")}) as srv:
        client = Client(srv.url)
        got = client.metrics()
        client.close()
    assert got == {'vllm:a_total{model_name="my model"}': 3.0, "vllm:b": 2.5}


def test_good_answers_still_read():
    with Server(
        {
            "/v1/models": answer(b'{"data": [{"id": "m", "max_model_len": 8}]}'),
            "/tokenize": answer(b'{"tokens": [1, 2]}'),
            "/v1/chat/completions": answer(
                b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
                b'data: {"choices": [], "usage": {"completion_tokens": 1, "prompt_tokens": 2}}\n\n'
                b"data: [DONE]\n\n",
                ctype="text/event-stream",
            ),
        }
    ) as srv:
        client = Client(srv.url)
        assert client.models() == [{"id": "m", "max_model_len": 8}]
        assert client.tokenize("m", prompt="x") == [1, 2]
        s = client.stream_chat("m", "x", 1)
        client.close()
    assert (s.text, s.completion_tokens, s.prompt_tokens) == ("hi", 1, 2)


# --------------------------------------------------------------------------- model packs


def _shard(path: Path, header: Any, data: bytes, *, raw: bytes | None = None) -> None:
    blob = raw if raw is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def _tensor(dtype: str = "F32", shape: list[Any] | None = None, offsets: Any = None) -> Any:
    return {"dtype": dtype, "shape": shape if shape is not None else [2],
            "data_offsets": offsets if offsets is not None else [0, 8]}  # fmt: skip


# case -> (header, data bytes, what the message must say); raw bytes replace the header
MODEL_HEADERS: dict[str, tuple[Any, bytes, str]] = {
    "negative offset": ({"w": _tensor(offsets=[-8, 0])}, b"\0" * 8, "negative"),
    "end before begin": ({"w": _tensor(offsets=[8, 0])}, b"\0" * 8, "end before"),
    "Infinity offset": ({"w": _tensor(offsets=[0, math.inf])}, b"\0" * 8, "Infinity is not"),
    "1e999 offset": (None, b"\0" * 8, "field w.data_offsets[1]"),
    "float offset": ({"w": _tensor(offsets=[0.0, 8.0])}, b"\0" * 8, "field w.data_offsets[0]"),
    "string offset": ({"w": _tensor(offsets=["0", "8"])}, b"\0" * 8, "field w.data_offsets[0]"),
    "three offsets": ({"w": _tensor(offsets=[0, 4, 8])}, b"\0" * 8, "not [begin, end]"),
    "overlapping": (
        {"a": _tensor(offsets=[0, 8]), "b": _tensor(offsets=[4, 12])},
        b"\0" * 12,
        "overlap",
    ),
    "a hole": (
        {"a": _tensor(offsets=[0, 8]), "b": _tensor(offsets=[16, 24])},
        b"\0" * 24,
        "a hole of 8 bytes",
    ),
    "shape/dtype mismatch": ({"w": _tensor("F16", [2])}, b"\0" * 8, "needs 4 bytes"),
    "shape too big for range": ({"w": _tensor("F32", [3])}, b"\0" * 8, "needs 12 bytes"),
    "unknown dtype": ({"w": _tensor("F128")}, b"\0" * 8, "unknown dtype"),
    "dtype a number": ({"w": _tensor(7)}, b"\0" * 8, "field w.dtype"),
    "negative dimension": ({"w": _tensor(shape=[-2])}, b"\0" * 8, "sizes >= 0"),
    "shape a string": ({"w": _tensor(shape="2")}, b"\0" * 8, "field w.shape"),
    "tensor a list": ({"w": [1, 2]}, b"\0" * 8, "field w"),
    "header a list": ([1, 2], b"", "expected an object"),
    "metadata values numbers": (
        {"__metadata__": {"a": 1}, "w": _tensor()},
        b"\0" * 8,
        "field __metadata__.a",
    ),
    "metadata a list": ({"__metadata__": [1], "w": _tensor()}, b"\0" * 8, "field __metadata__"),
    "dtype lowercase": ({"w": _tensor("f32")}, b"\0" * 8, "unknown dtype"),
    "rank 17": ({"w": _tensor(shape=[1] * 17)}, b"\0" * 8, "at most 16"),
    "offsets a dict": ({"w": _tensor(offsets={"0": 8})}, b"\0" * 8, "field w.data_offsets"),
    "header not UTF-8": (None, b"", "not UTF-8"),
    "header nested deep": (None, b"", "nested more than"),
    "header not JSON": (None, b"", "not JSON"),
    "header length past the file": (None, b"", "truncated inside"),
    "header length 2^63": (None, b"", "over the format's"),
    "truncated data": ({"w": _tensor()}, b"\0" * 4, "truncated"),
}

RAW_HEADERS = {
    "header not UTF-8": b'{"w": "\xff"}',
    "header nested deep": b"[" * 50_000,
    "header not JSON": b"{not json",
    "1e999 offset": b'{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 1e999]}}',
}


def _pack(tmp_path: Path, case: str) -> tuple[Path, Path]:
    pack = tmp_path / "glm"
    pack.mkdir()
    shard = pack / "model.safetensors"
    header, data, _ = MODEL_HEADERS[case]
    if case == "header length past the file":
        shard.write_bytes(struct.pack("<Q", 1000) + b"{}")
    elif case == "header length 2^63":
        shard.write_bytes(struct.pack("<Q", 1 << 63) + b"{}")
    else:
        _shard(shard, header, data, raw=RAW_HEADERS.get(case))
    (pack / "config.json").write_text('{"quant_method": "exl3"}')
    manifest = write_manifest(tmp_path, model='[model]\nrepo = "org/m"\n')
    return pack, manifest


@pytest.mark.parametrize("case", sorted(MODEL_HEADERS))
def test_model_check_fails_on_a_hostile_header(case, tmp_path, capsys):
    pack, manifest = _pack(tmp_path, case)
    rc = main(["--manifest", str(manifest), "model", "check", str(pack)])
    err = _flat(capsys.readouterr().err)
    assert rc == 6, err
    assert MODEL_HEADERS[case][2] in err and "next:" in err and "Traceback" not in err


def test_model_check_passes_a_good_pack(tmp_path, capsys):
    pack = tmp_path / "glm"
    pack.mkdir()
    _shard(pack / "model.safetensors", {"__metadata__": {"format": "pt"}, "w": _tensor()},
           b"\0" * 8)  # fmt: skip
    manifest = write_manifest(tmp_path, model='[model]\nrepo = "org/m"\n')
    assert main(["--manifest", str(manifest), "model", "check", str(pack)]) == 0


# case -> (what is written as the index, what the message must say)
MODEL_INDEX: dict[str, tuple[Any, str]] = {
    "a list": (b"[]", "expected an object"),
    "weight_map a list": (b'{"weight_map": ["a"]}', "field weight_map"),
    "weight_map missing": (b'{"metadata": {}}', "field weight_map: missing"),
    "shard a number": (b'{"weight_map": {"w": 1}}', "field weight_map.w"),
    "shard outside the pack": (b'{"weight_map": {"w": "../x.safetensors"}}', "not a file in the pack"),
    "shard absolute": (b'{"weight_map": {"w": "/etc/passwd"}}', "not a file in the pack"),
    "not UTF-8": (b'{"weight_map": {"\xff": "a"}}', "not UTF-8"),
    "nested deep": (DEEP, "nested more than"),
    "1 GiB (sparse)": (None, "more than the"),
    "a directory": (None, "is a directory"),
    "a shard that is a directory": (b'{"weight_map": {"w": "shard.safetensors"}}',
                                    "a directory, not a shard file"),
    "a shard that is missing": (b'{"weight_map": {"w": "nope.safetensors"}}', "missing"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(MODEL_INDEX))
def test_model_check_fails_on_a_hostile_index(case, tmp_path, capsys):
    pack = tmp_path / "glm"
    pack.mkdir()
    index = pack / "model.safetensors.index.json"
    body, gist = MODEL_INDEX[case]
    if case == "1 GiB (sparse)":
        with open(index, "wb") as fh:
            fh.truncate(1 << 30)  # no bytes written: refused by its size, never read
    elif case == "a directory":
        index.mkdir()
    else:
        index.write_bytes(body)
    if case == "a shard that is a directory":
        (pack / "shard.safetensors").mkdir()
    manifest = write_manifest(tmp_path, model='[model]\nrepo = "org/m"\n')
    rc = main(["--manifest", str(manifest), "model", "check", str(pack)])
    err = _flat(capsys.readouterr().err)
    assert rc == 6 and gist in err and "next:" in err and "Traceback" not in err, err


# case -> (config.json content, what the message must say)
MODEL_CONFIG: dict[str, tuple[Any, str]] = {
    "a list": (b"[1]", "expected an object"),
    "a string": (b'"exl3"', "expected an object"),
    "not UTF-8": (b'{"quant_method": "\xff"}', "not UTF-8"),
    "nested deep": (DEEP, "nested more than"),
    "not JSON": (b"{", "not JSON"),
    "a directory": (None, "is a directory"),
    "missing": (None, "missing"),
}


@pytest.mark.parametrize("case", sorted(MODEL_CONFIG))
def test_model_check_fails_on_a_hostile_config(case, tmp_path, capsys):
    pack = tmp_path / "glm"
    pack.mkdir()
    _shard(pack / "model.safetensors", {"w": _tensor()}, b"\0" * 8)
    body, gist = MODEL_CONFIG[case]
    config = pack / "config.json"
    if case == "a directory":
        config.mkdir()
    elif body is not None:
        config.write_bytes(body)
    model = '[model]\nrepo = "org/m"\n[model.config]\nquant_method = "exl3"\n'
    manifest = write_manifest(tmp_path, model=model)
    rc = main(["--manifest", str(manifest), "model", "check", str(pack)])
    err = _flat(capsys.readouterr().err)
    assert rc == 6 and "config.json" in err and gist in err and "Traceback" not in err, err


def test_model_check_on_a_file_says_it_is_not_a_directory(tmp_path, capsys):
    not_dir = tmp_path / "pack"
    not_dir.write_text("x")
    manifest = write_manifest(tmp_path, model='[model]\nrepo = "org/m"\n')
    rc = main(["--manifest", str(manifest), "model", "check", str(not_dir)])
    err = _flat(capsys.readouterr().err)
    assert rc == 2 and "is a file, not a directory" in err and "next:" in err  # the argument


def test_the_reader_counts_depth_without_recursion():
    assert untrusted.json_depth('{"a": "[[[[", "b": [[1]]}', 10) == 3
    with pytest.raises(VerifyError, match="nested more than 32"):
        untrusted.parse_json(b"[" * 33 + b"]" * 33, untrusted.PROVENANCE, "x")
    assert untrusted.parse_json(b"[" * 32 + b"]" * 32, untrusted.PROVENANCE, "x") is not None


# --------------------------------------------------------------------------- SHA256SUMS


@pytest.mark.parametrize("reader", ["install", "reuse", "release"])
def test_a_1_gib_sha256sums_is_refused_by_its_size_unread(reader, tmp_path, capsys):
    path = _receipt(tmp_path)
    sums = path.parent / "SHA256SUMS"
    with open(sums, "r+b") as fh:
        fh.truncate(1 << 30)  # sparse: nothing is written, nothing may be read
    if reader == "install":
        venv = tmp_path / "venv"
        rc = main(["install", str(path.parent), "--venv", str(venv), "--no-deps",
                   "--allow-unsigned"])  # fmt: skip
        err = _flat(capsys.readouterr().err)
        assert rc == 6 and "SHA256SUMS" in err and "more than" in err and not venv.exists()
    elif reader == "reuse":
        from pinwheel.compile.reuse import candidates

        with pytest.raises(VerifyError, match="SHA256SUMS: 1073741824 bytes, more than"):
            candidates(str(path.parent), tmp_path / "cache")
    else:
        manifest = write_manifest(tmp_path)
        rc = main(["--manifest", str(manifest), "release", "--from", str(path.parent)]
                  + ["--no-sign", "--out", str(tmp_path / "rel")])  # fmt: skip
        err = _flat(capsys.readouterr().err)
        assert rc == 6 and "SHA256SUMS" in err and "more than" in err
        assert not (tmp_path / "rel").exists()
