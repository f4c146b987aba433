"""Profilers for training on the HPU."""

from lightning_gaudi.profilers.hpu import HPUProfiler, ProfileReport, build_report

__all__ = ["HPUProfiler", "ProfileReport", "build_report"]
