# Drives a real Sidekiq for the tests: `ruby sidekiq_driver.rb <command> <JSON spec>`, with
# REDIS_URL pointing at the test's database.
#   push   push spec.jobs: {class, queue, args, count, in (seconds: scheduled), dead (killed
#          into the dead set)}
#   truth  print what the library itself says (queues, sizes, latencies, sets per queue, stats,
#          processes) as JSON
require "json"
require "sidekiq"
require "sidekiq/api"
require_relative "sidekiq_jobs"

def push(spec)
  spec.fetch("jobs").each do |job|
    job.fetch("count", 1).times do
      item = { "class" => Object.const_get(job.fetch("class", "PlannedJob")), "queue" => job.fetch("queue"),
               "args" => job.fetch("args", []) }
      item["at"] = Time.now.to_f + job["in"] if job["in"]
      if job["dead"]
        Sidekiq::DeadSet.new.kill(Sidekiq.dump_json(item.merge("jid" => SecureRandom.hex(12),
                                                               "failed_at" => Time.now.to_f)),
                                  notify_failure: false)
      else
        Sidekiq::Client.push(item)
      end
    end
  end
end

def by_queue(set)
  counts = Hash.new(0)
  set.each { |entry| counts[entry.queue] += 1 }
  counts
end

def truth(_spec)
  now = Time.now.to_f
  queues = Sidekiq::Queue.all.to_h { |q| [q.name, { "size" => q.size, "latency" => q.latency }] }
  scheduled = Sidekiq::ScheduledSet.new
  due = Hash.new(0)
  scheduled.each { |entry| due[entry.queue] += 1 if entry.at.to_f <= now }
  dead_oldest = {}
  Sidekiq::DeadSet.new.each do |entry|
    dead_oldest[entry.queue] = [dead_oldest[entry.queue] || now, entry.at.to_f].min
  end
  stats = Sidekiq::Stats.new
  processes = Sidekiq::ProcessSet.new.map do |process|
    { "identity" => process["identity"], "busy" => process["busy"],
      "concurrency" => process["concurrency"], "beat" => process["beat"],
      "queues" => process["queues"] }
  end
  busy = Hash.new(0)
  busy_since = {} # per queue, when its longest-running job started
  Sidekiq::Workers.new.each do |_process, _thread, work|
    busy[work["queue"]] += 1
    busy_since[work["queue"]] = [busy_since[work["queue"]], work["run_at"]].compact.min
  end
  puts JSON.generate(
    "now" => now, "queues" => queues, "scheduled" => by_queue(scheduled), "scheduled_due" => due,
    "retry" => by_queue(Sidekiq::RetrySet.new), "dead" => by_queue(Sidekiq::DeadSet.new),
    "dead_oldest" => dead_oldest, "busy" => busy, "busy_since" => busy_since, "processed" => stats.processed,
    "failed" => stats.failed, "processes" => processes
  )
end

command, spec = ARGV
{ "push" => method(:push), "truth" => method(:truth) }.fetch(command).call(JSON.parse(spec || "{}"))
