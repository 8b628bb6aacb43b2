set terminal pngcairo size 900,560
set output 'bench/results/sched.png'
set title 'agents, 2,000 requests, engine mode, 4,001 blocks: --schedule fcfs vs prefix'
set xlabel 'arrival rate (x the generator default)'
set ylabel 'computed prefill tokens (M)'
set y2label 'p99 queueing delay (s, simulated)'
set logscale x 2
set ytics nomirror
set y2tics
set key top left
set grid
plot 'bench/results/sched_sweep.dat' using 1:($2/1e6) with linespoints lw 2 pt 7 title 'fcfs: prefill tokens', \
     '' using 1:($3/1e6) with linespoints lw 2 pt 5 title 'prefix: prefill tokens', \
     '' using 1:4 axes x1y2 with linespoints lw 2 dt 2 pt 7 title 'fcfs: p99 delay', \
     '' using 1:5 axes x1y2 with linespoints lw 2 dt 2 pt 5 title 'prefix: p99 delay'
