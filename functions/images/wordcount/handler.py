"""Example function image: counts lines, words and bytes of its input (like ``wc``), as JSON."""

import json


def handle(body: bytes) -> bytes:
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise ValueError("wordcount: input must be UTF-8 text") from None
    return json.dumps({"lines": text.count("\n"), "words": len(text.split()), "bytes": len(body)}).encode()
