"""What a run shows: the counts and rates behind it (:mod:`.tally`), progress bars and paced lines
(:mod:`.progress`), log lines (:mod:`.logs`), Prometheus metrics and /progress (:mod:`.metrics`,
:mod:`.migration`), and a run's closing summary (:mod:`.summary`)."""
