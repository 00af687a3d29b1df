"""The supervisor: checks every input, creates the run directory, starts and watches the worker(s),
recovers (OOM ladder, auto-resume), answers stop requests, and the doctor. No torch."""
