"""The bottom layer: names, GIoU rules, input checks, errors, the command line generated from
a config, and Markdown/CSV tables, which every other folder uses. It imports nothing of the
project's own."""
