// Drives a real Bull (the `bull` package) for the tests: `node bull.cjs <install dir> <command> <JSON spec>`.
//
// The install dir (bull3, bull4) picks the library version, so one script serves both majors.
// Commands:
//   steps  run spec.steps (add jobs, pause, processors that finish a known number of jobs,
//          processors kept busy or idle), print "ready", then keep held processors until SIGTERM
//   truth  print what the library itself says about spec.queues, as JSON
//   finished  print every completed and failed job of spec.queues (getCompleted, getFailed)
// Jobs behave as their data says: {sleep_ms, fail: "always" | <attempts that fail>}.
'use strict';
const path = require('path');

const [installDir, command, specText] = process.argv.slice(2);
const Queue = require(path.resolve(installDir, 'node_modules', 'bull'));
const spec = JSON.parse(specText);
// Each Queue its own options: Bull 4 writes its worker name into the redis options it was
// given (bclient.options.connectionName), which would name every later connection made from them.
const options = () => ({ redis: { host: spec.host, port: spec.port, db: spec.db }, prefix: spec.prefix || 'bull' });

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function runJob(job) {
  const data = job.data || {};
  if (data.sleep_ms) await sleep(data.sleep_ms);
  const failing = data.fail === 'always' || job.attemptsMade < (data.fail || 0);
  if (failing) throw new Error(`planned failure of job ${job.id}`);
  return 'done';
}

// A processor that stops once the queue's jobs completed and failed (each failed attempt
// counts) the given numbers of times.
async function workUntil(queue, step) {
  const done = { completed: 0, failed: 0 };
  await new Promise(resolve => {
    const check = () => {
      if (done.completed >= (step.completed || 0) && done.failed >= (step.failed || 0)) resolve();
    };
    queue.on('completed', () => { done.completed += 1; check(); });
    queue.on('failed', () => { done.failed += 1; check(); });
    queue.process('*', 1, runJob); // every job name
  });
}

// A step's job data; `pad` bytes of body make a large job (too large for a command line).
const jobData = step => (step.pad ? { ...step.data, body: 'x'.repeat(step.pad) } : step.data || {});

async function steps() {
  const queues = {};
  const queue = name => (queues[name] = queues[name] || new Queue(name, options()));
  const held = [];
  for (const step of spec.steps) {
    if (step.op === 'add') {
      for (let i = 0; i < (step.count || 1); i += 1) {
        const q = queue(step.queue);
        await (step.name ? q.add(step.name, jobData(step), step.opts || {}) : q.add(jobData(step), step.opts || {}));
      }
    } else if (step.op === 'pause') {
      await queue(step.queue).pause();
    } else if (step.op === 'work') {
      const q = new Queue(step.queue, options());
      await workUntil(q, step);
      await q.close();
    } else if (step.op === 'hold') {
      // a processor that takes one long job and keeps it active until this process ends
      const q = new Queue(step.queue, options());
      await new Promise(resolve => {
        q.once('active', resolve);
        q.process('*', 1, runJob);
      });
      held.push(q);
    } else if (step.op === 'idle') {
      // a processor with nothing to do, kept until this process ends
      const q = new Queue(step.queue, options());
      q.process('*', 1, runJob);
      await q.isReady();
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

// The library's own view: counts per state, the next waiting jobs, the due delayed jobs, the
// active jobs' starts, the waiting jobs per priority.
async function truth() {
  const result = { now_ms: Date.now(), version: require(path.resolve(installDir, 'node_modules', 'bull', 'package.json')).version, queues: {} };
  for (const name of spec.queues) {
    const q = new Queue(name, options());
    const counts = await q.getJobCounts();
    const next = (await q.getWaiting(0, 0)).filter(Boolean).map(job => job.timestamp);
    const delayed = await q.getDelayed();
    // a delayed job is due at timestamp + delay; a retry waiting out its backoff (fixed in the
    // tests) some time after it started, so no earlier than processedOn + the backoff's delay
    const dueAt = job => (job.attemptsMade > 0
      ? job.processedOn + job.opts.backoff.delay
      : job.timestamp + job.delay);
    const due = delayed.filter(job => dueAt(job) <= result.now_ms).length;
    // its workers as Queue.getWorkers() lists them (CLIENT LIST entries: flags b = blocked),
    // of this database (getWorkers lists every database's connections of the same name)
    const workers = ((await q.getWorkers()) || [])
      .filter(c => Number(c.db) === spec.db)
      .map(c => ({ id: c.id, flags: c.flags, cmd: c.cmd }));
    // the start of each job a worker runs (processedOn: set when a worker took it)
    const started = (await q.getActive()).filter(Boolean).map(job => job.processedOn);
    // the waiting jobs per the priority they were added with (0: none)
    const priorities = {};
    for (const job of (await q.getWaiting()).filter(Boolean)) {
      const priority = job.opts.priority || 0;
      priorities[priority] = (priorities[priority] || 0) + 1;
    }
    result.queues[name] = {
      counts, next_timestamps_ms: next, due, workers, active_processed_on_ms: started, priorities,
    };
    await q.close();
  }
  console.log(JSON.stringify(result));
}

// Every finished job Bull keeps, as its own Job objects read them.
async function finished() {
  const result = { queues: {} };
  for (const name of spec.queues) {
    const q = new Queue(name, options());
    const jobs = {};
    for (const [state, list] of [['completed', await q.getCompleted()], ['failed', await q.getFailed()]]) {
      for (const job of list.filter(Boolean)) {
        jobs[job.id] = {
          state, name: job.name, processedOn: job.processedOn, finishedOn: job.finishedOn,
          attemptsMade: job.attemptsMade, failedReason: job.failedReason || null,
        };
      }
    }
    result.queues[name] = jobs;
    await q.close();
  }
  console.log(JSON.stringify(result));
}

const commands = { steps, truth, finished };
commands[command]().then(
  () => process.exit(0),
  error => { console.error(error); process.exit(1); },
);
