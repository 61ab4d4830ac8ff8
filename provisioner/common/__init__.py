"""Small utilities every layer may use, standard library only (the API client installs them
without the servers' packages): the injected clock, safe text, private files, port owners,
channel options, the garbage collector's freeze."""
