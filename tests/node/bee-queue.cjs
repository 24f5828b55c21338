// Drives a real Bee-Queue for the tests: `node bee-queue.cjs <install dir> <command> <JSON spec>`.
//
// The install dir (beequeue2) picks the library version. Commands:
//   steps  run spec.steps (create jobs, processors that finish a known number of jobs,
//          processors kept busy), print "ready", then keep held processors busy until SIGTERM
//   truth  print what the library itself says about spec.queues, as JSON
// Jobs behave as their data says: {sleep_ms, fail: "always" | <attempts that fail>}.
'use strict';
const path = require('path');

const [installDir, command, specText] = process.argv.slice(2);
const Queue = require(path.resolve(installDir, 'node_modules', 'bee-queue'));
const spec = JSON.parse(specText);
const settings = extra => ({
  redis: { host: spec.host, port: spec.port, db: spec.db },
  prefix: spec.prefix || 'bq',
  ...extra,
});

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function runJob(job) {
  const data = job.data || {};
  if (data.sleep_ms) await sleep(data.sleep_ms);
  if (data.fail === 'always') throw new Error(`planned failure of job ${job.id}`);
  return 'done';
}

async function create(queue, step) {
  const opts = step.opts || {};
  // `pad` bytes of body make a large job (too large for a command line)
  const job = queue.createJob(step.pad ? { ...step.data, body: 'x'.repeat(step.pad) } : step.data || {});
  if (opts.timestamp) job.options.timestamp = opts.timestamp; // created that long ago
  if (opts.retries) job.retries(opts.retries);
  if (opts.backoff) job.backoff('fixed', opts.backoff);
  if (opts.delay) job.delayUntil(Date.now() + opts.delay);
  await job.save();
}

// A processor that stops once the queue's jobs succeeded, failed and were retried the given
// numbers of times.
async function workUntil(step) {
  const queue = new Queue(step.queue, settings({ isWorker: true }));
  const done = { succeeded: 0, failed: 0, retrying: 0 };
  await new Promise(resolve => {
    const check = () => {
      if (['succeeded', 'failed', 'retrying'].every(event => done[event] >= (step[event] || 0))) {
        resolve();
      }
    };
    for (const event of ['succeeded', 'failed', 'retrying']) {
      queue.on(event, () => { done[event] += 1; check(); });
    }
    queue.process(1, runJob);
  });
  await queue.close();
}

async function steps() {
  const queues = {};
  const queue = name => (queues[name] = queues[name] || new Queue(name, settings({ isWorker: false })));
  const held = [];
  for (const step of spec.steps) {
    if (step.op === 'add') {
      for (let i = 0; i < (step.count || 1); i += 1) await create(queue(step.queue), step);
    } else if (step.op === 'work') {
      await workUntil(step);
    } else if (step.op === 'hold') {
      // a processor that takes one long job and keeps it active until this process ends
      const q = new Queue(step.queue, settings({ isWorker: true }));
      await new Promise(resolve => {
        q.process(1, job => { resolve(); return runJob(job); });
      });
      held.push(q);
    } else if (step.op === 'sleep') {
      await sleep(step.ms);
    } else {
      throw new Error(`unknown step ${step.op}`);
    }
  }
  await Promise.all(Object.values(queues).map(q => q.close()));
  console.log('ready');
  if (held.length === 0) return;
  await new Promise(resolve => process.once('SIGTERM', resolve));
}

// The library's own view: checkHealth() counts, the next waiting job, the due delayed jobs.
async function truth() {
  const version = require(path.resolve(installDir, 'node_modules', 'bee-queue', 'package.json')).version;
  const result = { now_ms: Date.now(), version, queues: {} };
  for (const name of spec.queues) {
    const q = new Queue(name, settings({ isWorker: false }));
    const counts = await q.checkHealth();
    delete counts.newestJob;
    const [next] = await q.getJobs('waiting', { start: -1, end: -1 });
    const delayed = await q.getJobs('delayed', { start: 0, end: -1 });
    // a delayed job is due at options.delay; a retry waiting out its (fixed) backoff no
    // earlier than its creation plus the backoff
    const dueAt = job => (job.status === 'retrying'
      ? job.options.timestamp + job.options.backoff.delay
      : job.options.delay);
    const due = delayed.filter(job => dueAt(job) <= result.now_ms).length;
    result.queues[name] = { counts, next_timestamp_ms: next ? next.options.timestamp : null, due };
    await q.close();
  }
  console.log(JSON.stringify(result));
}

const commands = { steps, truth };
commands[command]().then(
  () => process.exit(0),
  error => { console.error(error); process.exit(1); },
);
