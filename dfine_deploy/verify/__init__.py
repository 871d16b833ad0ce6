"""`dfine-verify`: an engine or graph checked against its artifact's reference pack on the device
that serves it (`check.verify`), its result kept in verify.json (`runtime/verify_record.py`)."""
