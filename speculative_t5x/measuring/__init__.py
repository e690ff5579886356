"""Measuring: timing, sweeps, reports, acceptance records, the draft shape chosen on the device."""
