// Drives a real BullMQ for the tests: `node bullmq.cjs <install dir> <command> <JSON spec>`.
//
// The install dir (bullmq5, bullmq6) picks the library version, so one script serves both
// majors. Commands:
//   steps  run spec.steps (add jobs, pause, flows, workers that finish a known number of jobs,
//          workers kept busy), print "ready", then keep held workers busy until SIGTERM
//   truth  print what the library itself says about spec.queues, as JSON (getWorkers() too)
//   work   a worker on spec.queue until SIGTERM, one JSON line per finished job
//   finished  every completed and failed job of spec.queues, as BullMQ's own Job objects read
//          them (getJobs): its state, name, attemptsMade (every attempt, the last included)
//          and failedReason
// Jobs behave as their data says: {sleep_ms, fail: "always" | <attempts that fail>}.
'use strict';
const path = require('path');

const [installDir, command, specText] = process.argv.slice(2);
const { Queue, Worker, FlowProducer } = require(path.resolve(installDir, 'node_modules', 'bullmq'));
const spec = JSON.parse(specText);
// spec.cluster: the seed nodes of a Redis Cluster, [{host, port}], read through ioredis's
// Cluster client as BullMQ's docs say (its keys then need a hash tag: prefix or queue names).
const connection = spec.cluster
  ? new (require(path.resolve(installDir, 'node_modules', 'ioredis')).Cluster)(spec.cluster, {
    redisOptions: { maxRetriesPerRequest: null },
  })
  : { host: spec.host, port: spec.port, db: spec.db, maxRetriesPerRequest: null };
const prefix = spec.prefix || 'bull';

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function runJob(job) {
  const data = job.data || {};
  if (data.sleep_ms) await sleep(data.sleep_ms);
  const failing = data.fail === 'always' || job.attemptsMade < (data.fail || 0);
  if (failing) throw new Error(`planned failure of job ${job.id}`);
  return 'done';
}

function worker(queue, options = {}) {
  return new Worker(queue, runJob, { connection, prefix, ...options });
}

// A worker that stops once it has completed and failed the given numbers of jobs. With
// step.report, each completed job is printed as the worker got it from the library (a JSON line
// {"completed": {queue, name, processed_on, finished_on}}, times in ms), before "ready".
async function workUntil(step) {
  const done = { completed: 0, failed: 0 };
  const w = worker(step.queue, step.options);
  const report = job => console.log(JSON.stringify({
    completed: {
      queue: step.queue, name: job.name,
      processed_on: Number(job.processedOn), finished_on: Number(job.finishedOn),
    },
  }));
  await new Promise(resolve => {
    const check = () => {
      if (done.completed >= (step.completed || 0) && done.failed >= (step.failed || 0)) resolve();
    };
    w.on('completed', job => {
      if (step.report) report(job);
      done.completed += 1;
      check();
    });
    w.on('failed', () => { done.failed += 1; check(); });
  });
  await w.close(true); // its jobs are finished; forced, it does not wait out a blocking read
}

async function steps() {
  const queues = {};
  const queue = (name, options = {}) =>
    (queues[name] = queues[name] || new Queue(name, { connection, prefix, ...options }));
  const held = [];
  for (const step of spec.steps) {
    if (step.op === 'add') {
      for (let i = 0; i < (step.count || 1); i += 1) {
        await queue(step.queue, step.queue_options).add(step.name || 'job', step.data || {}, step.opts || {});
      }
    } else if (step.op === 'pause') {
      await queue(step.queue).pause();
    } else if (step.op === 'flow') {
      await new FlowProducer({ connection, prefix }).add({
        name: 'parent', queueName: step.queue, data: {},
        children: step.children.map(child => ({ name: 'child', queueName: child, data: {} })),
      });
    } else if (step.op === 'work') {
      await workUntil(step);
    } else if (step.op === 'hold') {
      // a worker that takes one long job and keeps it active until this process ends
      const w = worker(step.queue, { concurrency: 1, ...step.options });
      await new Promise(resolve => w.once('active', resolve));
      held.push(w);
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
  await Promise.all(held.map(w => w.close(true)));
}

// The library's own view: counts per state, the next job of each waiting state, due delayed jobs.
async function truth() {
  const result = { now_ms: Date.now(), queues: {} };
  for (const name of spec.queues) {
    const q = new Queue(name, { connection, prefix });
    const states = ['active', 'completed', 'delayed', 'failed', 'paused', 'prioritized', 'wait',
      'waiting-children'];
    const counts = await q.getJobCounts(...states);
    const next = {};
    for (const state of ['wait', 'paused', 'prioritized']) {
      const [job] = await q.getJobs([state], 0, 0, true);
      next[state] = job ? job.timestamp : null;
    }
    // when the job running longest started (getActive(): each job's processedOn)
    const started = (await q.getActive()).map(job => job.processedOn);
    const running_since_ms = started.length ? Math.min(...started) : null;
    const delayed = await q.getDelayed();
    const due = delayed.filter(job => job.timestamp + job.delay <= result.now_ms).length;
    // getWorkers() lists every database's connections named for the queue: this one's only
    const workers = (await q.getWorkers()).filter(c => Number(c.db) === (spec.db || 0)).length;
    result.queues[name] = { counts, next_timestamp_ms: next, running_since_ms, due, paused: await q.isPaused(), workers };
    await q.close();
  }
  console.log(JSON.stringify(result));
}

async function finished() {
  const result = { queues: {} };
  for (const name of spec.queues) {
    const q = new Queue(name, { connection, prefix });
    const jobs = {};
    for (const state of ['completed', 'failed']) {
      for (const job of (await q.getJobs([state])).filter(Boolean)) {
        jobs[job.id] = { state, name: job.name, attemptsMade: job.attemptsMade, failedReason: job.failedReason || null };
      }
    }
    result.queues[name] = jobs;
    await q.close();
  }
  console.log(JSON.stringify(result));
}

async function work() {
  const w = worker(spec.queue, spec.options);
  w.on('completed', job => console.log(JSON.stringify({ id: job.id, result: 'completed' })));
  w.on('failed', job => console.log(JSON.stringify({ id: job.id, result: 'failed', attempts: job.attemptsMade })));
  await w.waitUntilReady();
  console.log('ready');
  await new Promise(resolve => process.once('SIGTERM', resolve));
  await w.close();
}

const commands = { steps, truth, work, finished };
commands[command]().then(
  () => process.exit(0),
  error => { console.error(error); process.exit(1); },
);
