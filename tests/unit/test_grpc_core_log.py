"""gRPC core log lines become vflink log records, not raw lines on stderr."""

from __future__ import annotations

import logging

from vflink.cli._grpc_log import core_line_record


def test_core_lines_are_recognised_and_levelled() -> None:
    assert core_line_record("W1124 14:49:56.485389   31605 log.cc:102] Log level INFO is not "
                            "suitable for production. Prefer WARNING or ERROR.") == (0, "")
    level, text = core_line_record(
        "I0000 00:00:1732459864.1 4242 ssl_transport_security.cc:1665] Handshake failed with "
        "error SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_"
        "FAILED\n") or (None, "")
    assert level == logging.WARNING and "TLS handshake failed" in text
    assert "CERTIFICATE_VERIFY_FAILED" in text
    assert core_line_record("I1124 14:49:56.5 1 chttp2_server.cc:10] listening\n") == (
        logging.DEBUG, "gRPC (chttp2_server.cc:10): listening")
    assert core_line_record("E1124 14:49:56.5 1 tcp.cc:3] boom")[0] == logging.ERROR  # type: ignore[index]


def test_other_lines_pass_through() -> None:
    assert core_line_record("coordinator (coordinator) serving on 127.0.0.1:1\n") is None
    assert core_line_record("Traceback (most recent call last):\n") is None
