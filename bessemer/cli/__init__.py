"""Command-line entry points: parse flags, call the library. No logic here."""
