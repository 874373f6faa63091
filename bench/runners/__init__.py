"""Child processes of the harness: one implementation each, so that RSS and CPU are its own."""
