"""localcluster.kube: what the client makes of a response body."""

from __future__ import annotations

from localcluster import kube


def test_a_text_body_becomes_a_message_not_a_decode_error() -> None:
    # The API server answers a resource it does not serve (a CRD not yet established)
    # with a text/plain 404: the caller must see the status, not a JSONDecodeError.
    assert kube._decode(b"404 page not found\n") == {"message": "404 page not found\n"}
    assert kube._decode(b'{"kind": "Status", "code": 404}') == {"kind": "Status", "code": 404}
    assert kube._decode(b"") == {}
