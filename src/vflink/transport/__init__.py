"""Transports: in-process (simulation); accounting and transcripts shared by all."""

from __future__ import annotations

from vflink.transport.accounting import Record, TrafficCounter, Transcript
from vflink.transport.inprocess import InProcessChannel, InProcessHub

__all__ = ["InProcessChannel", "InProcessHub", "Record", "TrafficCounter", "Transcript"]
