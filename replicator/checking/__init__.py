"""Proving a copy: ``mcdc verify`` (:mod:`.verify`), the embedded verifier of ``tail --verify``
(:mod:`.verifier`, :mod:`.recheck`, :mod:`.sweep_state`) and what a cutover compares (:mod:`.cutover_check`)."""
