"""The Redis key sampler: depth and head-of-queue age of every key that matches a key group.

sampler.py runs a cycle; groups.py is the data that says which keys hold a queue; scans.py,
room.py, values.py and look_alikes.py choose the keys; commands.py and rounds.py read them;
items.py and types.py say what the replies mean."""
