"""Data in and out: the plan of work units, reading and tokenizing a unit's rows, the output
directory's layout, atomic part commits, the run manifest, and the pre-flight checks.

Nothing here starts an engine; everything later in the pipeline reads and writes through it.
"""
