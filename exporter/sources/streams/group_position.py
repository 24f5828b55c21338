"""Where the consumer group stands, checked atomically with every read: no entry applied twice,
every entry that can no longer be read counted as lost.

The consumer runs POSITION_SCRIPT in the transaction of each XREADGROUP, so the script sees
exactly the state the read starts from (several replicas sharing the group count each lost
entry once, like each event). It passes what it saw at its previous read (`Seen`): the group's
last-delivered id, the stream's entries-added and last id, the group's entries-read (Redis 7).
Against that, the script recognises three ways entries go missing:

- trimmed unread (XTRIM, MAXLEN ~): the group's last-delivered id lies before the stream's
  first entry; (entries-added - length) entries precede the first one, entries-read of them
  were delivered, the rest are lost. ENTRIESREAD is moved past them (Redis would otherwise
  count them as lag forever).
- the group destroyed (XGROUP DESTROY, or the stream expired with it): it is created again at
  the last id this consumer saw delivered, never at 0, so nothing is applied twice.
- the stream lost what the consumer saw (Redis restarted without it, restored an older copy,
  or the key was deleted and written anew): its entries-added went down, its last id went
  below the seen one, fewer entries precede its first one than had been read (than had been
  added, when all its entries are newer than the newest seen), or the seen entry is gone
  without a deletion to explain it. The entries still unread at the previous read (seen
  entries-added - entries-read) are counted lost: exact when nothing was added between that
  read and the loss, a lower bound otherwise. Entries of the new stream up to the seen id are
  taken as applied (stream ids grow with time: only a restored older copy has any).

Before Redis 7 there is no entries-added: the group is created when missing, nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

# KEYS[1] stream; ARGV[1] group, ARGV[2] start of a group created without history ($ or 0),
# ARGV[3..6] Seen.args(). Returns {status, lost, last-delivered id, entries-added, entries-read,
# last-generated id}: status 0 ready, 1 no such stream, 2 ready after finding that the stream
# lost data; -1 for a count Redis does not know.
POSITION_SCRIPT = """
local key, group, start = KEYS[1], ARGV[1], ARGV[2]
local seen_id, seen_added, seen_read = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local seen_newest = ARGV[6]
if redis.call('EXISTS', key) == 0 then return {1, 0, '', -1, -1, ''} end
local function field(reply, name)
  for i = 1, #reply, 2 do if reply[i] == name then return reply[i + 1] end end
  return nil
end
local function parts(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local function less(a, b)
  local ams, aseq = parts(a)
  local bms, bseq = parts(b)
  return ams < bms or (ams == bms and aseq < bseq)
end
local stream = redis.call('XINFO', 'STREAM', key)
local added, length = field(stream, 'entries-added'), field(stream, 'length')
local newest = field(stream, 'last-generated-id')
local first = field(stream, 'first-entry')
local first_id = first and first[1] or nil
local info = nil
for _, g in ipairs(redis.call('XINFO', 'GROUPS', key)) do
  if field(g, 'name') == group then info = g end
end
if not added then  -- before Redis 7: no counters to check against
  if info then return {0, 0, field(info, 'last-delivered-id'), -1, -1, newest} end
  redis.call('XGROUP', 'CREATE', key, group, start)
  return {0, 0, start == '$' and newest or '0-0', -1, -1, newest}
end
local before_first = added - length
local last, read = nil, nil
if info then
  last, read = field(info, 'last-delivered-id'), field(info, 'entries-read')
end
local lost, status = 0, 0

local function place(id, entries_read)
  local verb = info and 'SETID' or 'CREATE'
  if entries_read then
    redis.call('XGROUP', verb, key, group, id, 'ENTRIESREAD', entries_read)
  else
    redis.call('XGROUP', verb, key, group, id)
  end
  last, read, info = id, entries_read, info or {}
end

if seen_id ~= '' and seen_id ~= '0-0' and seen_added then
  local reset = added < seen_added or less(newest, seen_id)
  if not reset and first_id and less(seen_newest, first_id) then
    -- every entry of the stream came after the previous read: all seen ones precede them
    reset = before_first < seen_added
  elseif not reset and first_id and less(seen_id, first_id) then
    reset = seen_read ~= nil and before_first < seen_read
  elseif not reset and first_id then
    local deleted = field(stream, 'max-deleted-entry-id')
    reset = #redis.call('XRANGE', key, seen_id, seen_id) == 0
      and (not deleted or less(deleted, seen_id))
  end
  local position, position_read = seen_id, seen_read
  if reset then
    if less(newest, seen_id) then
      position, position_read = newest, added
    elseif not first_id or less(seen_id, first_id) then
      position_read = 0
    else
      position_read = nil
    end
  end
  -- Behind what this consumer saw delivered: move the group up, unless no entry lies between
  -- (after a reset another replica may have placed it already; counting again would double).
  if not info or (less(last, position) and not (reset and (not first_id or less(position, first_id)))) then
    place(position, position_read)
    if reset and seen_read then lost = seen_added - seen_read end
  end
  if reset then status = 2 end
elseif not info then
  if start == '$' then
    place(newest, added)
  else
    place('0-0', before_first)
  end
end

if first_id and less(last, first_id) and not (read and read >= before_first) then
  if read then lost = lost + before_first - read end
  redis.call('XGROUP', 'SETID', key, group, last, 'ENTRIESREAD', before_first)
  read = before_first
end
return {status, lost, last, added, read or -1, newest}
"""


@dataclass(slots=True)
class Seen:
    """What the consumer saw at its last read: the group's last-delivered id after it, the
    stream's entries-added, the group's entries-read after it (-1: not known) and the
    stream's last-generated id."""

    last_id: str = ""
    added: int = -1
    read: int = -1
    newest: str = ""

    def covers(self, entry_id: bytes) -> bool:
        """Whether the entry lies at or before the last id seen delivered."""
        return bool(self.last_id) and _id(entry_id.decode()) <= _id(self.last_id)

    def args(self) -> tuple[str, str, str, str]:
        if not self.last_id or self.added < 0 or not self.newest:
            return "", "", "", ""
        read = str(self.read) if self.read >= 0 else ""
        return self.last_id, str(self.added), read, self.newest


def _id(text: str) -> tuple[int, int]:
    milliseconds, _, sequence = text.partition("-")
    return int(milliseconds), int(sequence or 0)
