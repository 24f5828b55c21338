# Job classes for the Sidekiq tests: loaded by the real `sidekiq` worker (-r) and by the driver.
# A job sleeps `sleep_ms`, then fails when told to: "always", or its first `n` attempts.
require "sidekiq"

# redis-rb 4.8 warns on every BRPOP Sidekiq 6.4 sends; the logs are for the tests to read
Redis.silence_deprecations = true if Redis.respond_to?(:silence_deprecations=)

class PlannedJob
  include Sidekiq::Worker
  sidekiq_options retry: 3
  # retries come back after a second instead of Sidekiq's default minutes
  sidekiq_retry_in { |_count, _error| 1 }

  def perform(sleep_ms = 0, fail = nil)
    sleep(sleep_ms / 1000.0) if sleep_ms.positive?
    attempt = retry_count_of_this_attempt
    raise "planned failure" if fail == "always" || (fail.is_a?(Integer) && attempt < fail)
  end

  # Sidekiq passes no attempt number to perform: it is in the job's JSON, which the
  # middleware below records.
  def retry_count_of_this_attempt
    Thread.current[:planned_attempt] || 0
  end
end

# A job whose retry waits an hour: it stays in the retry set while the test looks.
class PatientJob < PlannedJob
  sidekiq_retry_in { |_count, _error| 3600 }
end

# A job without retries: a failure sends it straight to the dead set.
class DoomedJob < PlannedJob
  sidekiq_options retry: 0
end

# Records the attempt number ("retry_count" is absent on the first run, 0 on the first retry).
class AttemptMiddleware
  def call(_worker, job, _queue)
    Thread.current[:planned_attempt] = job.key?("retry_count") ? job["retry_count"] + 1 : 0
    yield
  end
end

# A scheduler that moves nothing, for the tests that compare the schedule and retry sets with
# Sidekiq's own view (SIDEKIQ_SCHEDULER=held): the sets hold still while they look.
class HeldScheduler
  def enqueue_jobs(*); end

  def terminate; end
end

Sidekiq.configure_server do |config|
  config.server_middleware { |chain| chain.add AttemptMiddleware }
  # due jobs and retries move to their queues about every second (Sidekiq: ~5 s)
  config.options[:poll_interval_average] = 1
  config.options[:scheduled_enq] = HeldScheduler if ENV["SIDEKIQ_SCHEDULER"] == "held"
end
