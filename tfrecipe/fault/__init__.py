"""Fault tolerance: backups of the full training state, and preemption (SIGTERM/Ctrl-C -> a backup
-> exit 75)."""
