"""The engine-server client's answers are capped by what the request can produce: a
prompt_logprobs answer with a huge entry is refused before it is parsed (issue 49: "a
huge logprobs entry a MemoryError"), against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from hostile_server import Server, answer
from pinwheel.errors import PinwheelError
from pinwheel.serve.client import Client


def _huge_entry(entries: int) -> bytes:
    row = {str(i): {"logprob": -1.0, "rank": i + 1, "decoded_token": "x" * 40}
           for i in range(entries)}  # fmt: skip
    return json.dumps({"choices": [{"text": "", "prompt_logprobs": [None, row]}]}).encode()


def test_a_huge_prompt_logprobs_entry_is_refused_before_it_is_parsed() -> None:
    body = _huge_entry(100_000)  # ~8 MB: one position holding 100,000 entries for top_k 5
    with Server({"/v1/completions": answer(body)}) as srv:
        client = Client(srv.url, timeout=10, deadline=60)
        try:
            with pytest.raises(PinwheelError, match="more than the") as err:
                client.prompt_logprobs("m", [1, 2], 5)
        finally:
            client.close()
    assert err.value.next


def test_an_answer_of_the_asked_size_is_read() -> None:
    body = _huge_entry(6)
    with Server({"/v1/completions": answer(body)}) as srv:
        client = Client(srv.url, timeout=10, deadline=60)
        try:
            rows = client.prompt_logprobs("m", [1, 2], 5)
        finally:
            client.close()
    assert rows[0] is None and len(rows[1]) == 6
