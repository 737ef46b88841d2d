"""Measuring by running: ``batchspec tune`` (tokens/s and acceptance per K, domain, batch size
and engine, written to the tuning file) and ``batchspec verify`` (the job's speculation against
plain decoding, with the statistics that judge it).

Both start and drive engines as a worker does, on a fixed sample (``engines.ListSource``), and
both use the K model (``speculation``) without being part of it: ``tune`` feeds the model a file
that a run reads, ``verify`` checks what the engines did. So this layer sits after
``speculation`` and before ``work``: a run never needs it (it reads the tuning file through
``speculation.tuning``), and it never needs a run's claiming, leases or writer.
"""
