// graphile-worker driven through its own API for tests/config/test_preset_graphile_worker.py
// (run with tests/node/graphile_worker<version>):
//   node graphile_worker.cjs <version> seed DSN SCHEMA   -> migrate, add jobs, run them once
//       (complete, fail for good, fail into a retry pushed an hour out), remove one
//   node graphile_worker.cjs <version> work DSN SCHEMA RELEASE_FILE -> holds a job until the file exists
const path = require('node:path')
const fs = require('node:fs')
const [version, command, dsn, schema, extra] = process.argv.slice(2)
const worker = require(path.join(__dirname, `graphile_worker${version}`, 'node_modules', 'graphile-worker'))

const options = { connectionString: dsn, schema, noHandleSignals: true, logger: new worker.Logger(() => () => {}) }

async function seed () {
  const utils = await worker.makeWorkerUtils(options)
  await utils.migrate()
  const add = (task, payload, spec = {}) => utils.addJob(task, payload, spec)
  for (let n = 0; n < 4; n++) await add('send_email', { to: n }, { queueName: 'emails' })
  for (let n = 0; n < 2; n++) await add('explode', {}, { queueName: 'emails', maxAttempts: 1 })
  const flaky = await add('flaky', {}, { maxAttempts: 5 })
  const later = new Date(Date.now() + 3600 * 1000)
  for (let n = 0; n < 3; n++) await add('send_email', { to: 'x' }, { runAt: later })
  await add('send_email', { to: 'cancelled' }, { runAt: later, jobKey: 'cancel-me' })
  await utils.withPgClient((client) => client.query(`select ${schema}.remove_job($1)`, ['cancel-me']))
  for (let n = 0; n < 5; n++) await add('later', {}) // no worker runs "later": they wait
  await add('later', {}, { runAt: new Date(Date.now() + 1000) }) // due a second later
  const taskList = {
    send_email: async () => {},
    explode: async () => { throw new Error('the task fails on purpose') },
    flaky: async () => { throw new Error('the task fails on purpose, and is retried') }
  }
  // runOnce ends when it finds nothing to take, which a busy serial queue can look like (0.18):
  // again until no job of these tasks is due
  const due = () => utils.withPgClient((client) => client.query(
    `select count(*)::int as n from ${schema}.jobs where task_identifier = any($1)
     and run_at <= now() and attempts < max_attempts and locked_at is null`,
    [Object.keys(taskList)]))
  for (let round = 0; round < 20 && (await due()).rows[0].n > 0; round++) {
    await worker.runOnce({ ...options, taskList })
  }
  // its retry, pushed an hour out: it stays a retry while the test reads it
  await utils.rescheduleJobs([flaky.id], { runAt: later })
  await utils.release()
}

async function work (release) {
  const utils = await worker.makeWorkerUtils(options)
  await utils.addJob('hold', {}, { queueName: 'slow' })
  await utils.release()
  const runner = await worker.run({
    ...options,
    concurrency: 1,
    pollInterval: 200,
    taskList: {
      hold: async () => {
        while (!fs.existsSync(release)) await new Promise((resolve) => setTimeout(resolve, 50))
      }
    }
  })
  process.on('SIGTERM', async () => { await runner.stop(); process.exit(0) })
  console.error('working')
}

const commands = { seed, work: () => work(extra) }
commands[command]().catch((error) => { console.error(error); process.exit(1) })
